// Runs the official Durable Streams conformance suite against CONFORMANCE_TEST_URL.
// The suite's own CLI finds no test files under node_modules, so this file is the entry point.
// auth-fetch.mjs is imported first: with CONFORMANCE_TOKEN set it adds the bearer token to
// the suite's requests before the suite (or its client library) can take a reference to fetch.
import "./auth-fetch.mjs"
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) throw new Error("CONFORMANCE_TEST_URL is required (e.g. http://127.0.0.1:4437/v1/stream)")
runConformanceTests({ baseUrl })
