// Gives the suite's requests a bearer token: the suite has no header option, so this wraps
// the global fetch. With CONFORMANCE_TOKEN set, a request to CONFORMANCE_TEST_URL's origin
// that carries no Authorization header of its own gets `Authorization: Bearer <token>`;
// requests elsewhere (the suite's own webhook receivers) are left as they are.
const token = process.env.CONFORMANCE_TOKEN
const base = process.env.CONFORMANCE_TEST_URL
if (token && base && !globalThis.fetch.__ursulaAuth) {
  const origin = new URL(base).origin
  const inner = globalThis.fetch
  const wrapped = (input, init) => {
    const url = input instanceof Request ? input.url : String(input)
    let target
    try {
      target = new URL(url, base).origin
    } catch {
      return inner(input, init)
    }
    if (target !== origin) return inner(input, init)
    const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined))
    if (!headers.has("authorization")) headers.set("authorization", `Bearer ${token}`)
    return inner(input, { ...init, headers })
  }
  wrapped.__ursulaAuth = true
  globalThis.fetch = wrapped
}
