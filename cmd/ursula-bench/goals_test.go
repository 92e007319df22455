package main

import (
	"strings"
	"testing"
)

func TestGoalLine(t *testing.T) {
	run := func(label string, rs ...Result) Run { return Run{Label: label, Results: rs} }
	nethttp := func(ops float64) Result {
		return Result{Scenario: "append-64", Concurrency: 64, OpsPerSec: ops, Client: "nethttp"}
	}
	one := func(p50 float64) Result {
		return Result{Scenario: "append-1", Concurrency: 1, P50Ms: p50, Client: "raw"}
	}
	runs := []Run{run("raft", nethttp(2100), one(0.119)), run("reference", nethttp(1000)), run("memory", one(0.121))}
	throughput, latency := goals[0], goals[2]
	for _, tc := range []struct {
		name string
		g    goal
		runs []Run
		want string // prefix of the line; "" = no line
	}{
		{"ratio met", throughput, runs, "met     default engine, 64 writers: at least the fastest in-memory peer (2x reference): 2.10x reference"},
		{"ratio not met", throughput, []Run{run("raft", nethttp(1999)), runs[1]}, "NOT MET default engine, 64 writers"},
		{"no reference run", throughput, runs[:1], ""},
		{"no such scenario", throughput, []Run{run("raft", one(0.1)), runs[1]}, ""},
		{"zero reference", throughput, []Run{runs[0], run("reference", nethttp(0))}, ""},
		{"p50 met", latency, runs, "met     default engine, 1 writer p50 under 120 µs: 119 µs"},
		{"p50 not met", goal{Label: "memory", Key: "append-1", Metric: "p50", Value: 0.120, Text: "x"}, runs, "NOT MET x: 121 µs"},
	} {
		got := goalLine(tc.g, tc.runs)
		if tc.want == "" && got != "" || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: got %q want prefix %q", tc.name, got, tc.want)
		}
	}
}
