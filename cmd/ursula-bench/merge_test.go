package main

import (
	"testing"
	"time"
)

func TestMergeRunsTakesMedians(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	round := func(at time.Duration, ops, p50 float64, errs int64, msg string, extra ...Result) Run {
		rs := []Result{{Scenario: "append-64", Client: "raw", OpsPerSec: ops, P50Ms: p50, Errors: errs, FirstError: msg, Ops: int64(ops) * 5}}
		return Run{Label: "raft", Started: t0.Add(at), Results: append(rs, extra...)}
	}
	sse := Result{Scenario: "sse-100", OpsPerSec: 5000, P99Ms: 7}
	for _, tc := range []struct {
		name     string
		runs     []Run
		ops, p50 float64
		errs     int64
		msg      string
		rounds   int
	}{
		{"odd", []Run{round(2*time.Minute, 9000, 5, 0, ""), round(0, 13000, 3, 1, "boom"), round(time.Minute, 8000, 9, 0, "")}, 9000, 5, 1, "boom", 3},
		{"even", []Run{round(0, 8000, 4, 0, ""), round(time.Minute, 10000, 6, 2, "x")}, 9000, 5, 2, "x", 2},
		{"one", []Run{round(0, 7000, 2, 0, "")}, 7000, 2, 0, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := mergeRuns(tc.runs)
			if err != nil {
				t.Fatal(err)
			}
			r, ok := findResult(m, "append-64")
			if !ok || r.OpsPerSec != tc.ops || r.P50Ms != tc.p50 || r.Errors != tc.errs || r.FirstError != tc.msg || r.Rounds != tc.rounds {
				t.Fatalf("merged %+v", r)
			}
			if !m.Started.Equal(t0) || m.Label != "raft" {
				t.Fatalf("merged run %q started %v", m.Label, m.Started)
			}
		})
	}
	// A scenario only some rounds have is the median of those.
	m, err := mergeRuns([]Run{round(0, 1, 1, 0, "", sse), round(0, 1, 1, 0, "")})
	if r, ok := findResult(m, "sse-100"); err != nil || !ok || r.Rounds != 1 || r.P99Ms != 7 {
		t.Fatalf("sse-100 of one round: %+v %v", r, err)
	}
	// Rounds of different targets never merge.
	other := round(0, 1, 1, 0, "")
	other.Label = "memory"
	if _, err := mergeRuns([]Run{round(0, 1, 1, 0, ""), other}); err == nil {
		t.Fatal("runs of two targets merged")
	}
	if _, err := mergeRuns(nil); err == nil {
		t.Fatal("nothing merged without an error")
	}
}
