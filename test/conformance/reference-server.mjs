// Starts the Durable Streams reference server (@durable-streams/server) for side-by-side
// benchmarks and conformance comparisons. Usage: node reference-server.mjs [port]
import { DurableStreamTestServer } from "@durable-streams/server"

const port = Number(process.argv[2] ?? 4438)
const server = new DurableStreamTestServer({ port, host: "127.0.0.1" })
await server.start()
console.log(`reference server listening on http://127.0.0.1:${port}/v1/stream/`)
const stop = async () => { await server.stop(); process.exit(0) }
process.on("SIGTERM", stop)
process.on("SIGINT", stop)
