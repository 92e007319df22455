//go:build race

package server

// raceEnabled: the race detector slows the cold tests' byte shuffling about tenfold, so
// the large-stream test writes less under -race (make test also runs it without -race at
// full size).
const raceEnabled = true
