package main

import (
	"fmt"
	"io"
	"slices"
)

// goal is one performance target of the project, checked on the runs of one make bench:
// the figure of run Label (scenario Key) against a fixed value, or against Ratio times
// the same scenario's figure of run Vs.
type goal struct {
	Label, Key string
	Metric     string  // "ops/s" (at least) or "p50" (at most, milliseconds)
	Vs         string  // "" = compare with Value
	Ratio      float64 // at least Ratio x Vs (ops/s)
	Value      float64 // p50 at most Value ms
	Text       string
}

// goals are the targets of the performance issue. The throughput ratios use the plain
// net/http client; the fastest in-memory peer measured 1.95x the reference server, so
// "at least the fastest peer" is 2x the reference and "1.3x the fastest peer" is 2.5x.
var goals = []goal{
	{Label: "raft", Key: "append-64 nethttp", Metric: "ops/s", Vs: "reference", Ratio: 2, Text: "default engine, 64 writers: at least the fastest in-memory peer (2x reference)"},
	{Label: "memory", Key: "append-64 nethttp", Metric: "ops/s", Vs: "reference", Ratio: 2.5, Text: "memory engine, 64 writers: 1.3x the fastest peer (2.5x reference)"},
	{Label: "raft", Key: "append-1", Metric: "p50", Value: 0.120, Text: "default engine, 1 writer p50 under 120 µs"},
	{Label: "memory", Key: "append-1", Metric: "p50", Value: 0.120, Text: "memory engine, 1 writer p50 under 120 µs"},
	{Label: "raft-always", Key: "append-64 nethttp", Metric: "ops/s", Vs: "raft", Ratio: 0.5, Text: "fsync always, 64 writers: at least 50% of fsync never"},
	{Label: "raft-always", Key: "append-64", Metric: "ops/s", Vs: "raft", Ratio: 0.5, Text: "fsync always, 64 writers (raw client): at least 50% of fsync never"},
	{Label: "raft3", Key: "append-64 nethttp", Metric: "ops/s", Vs: "memory", Ratio: 0.5, Text: "3-node cluster, 64 writers: at least 50% of the memory engine"},
	{Label: "raft3", Key: "append-1", Metric: "p50", Value: 1, Text: "3-node cluster, 1 writer p50 under 1 ms"},
}

// goalLine is the verdict on one goal, or "" when the runs lack a figure it needs.
func goalLine(g goal, runs []Run) string {
	get := func(label, key string) (Result, bool) {
		i := slices.IndexFunc(runs, func(r Run) bool { return r.Label == label })
		if i < 0 {
			return Result{}, false
		}
		return findResult(runs[i], key)
	}
	r, ok := get(g.Label, g.Key)
	if !ok {
		return ""
	}
	verdict := func(met bool) string {
		if met {
			return "met"
		}
		return "NOT MET"
	}
	switch {
	case g.Metric == "p50":
		return fmt.Sprintf("%-7s %s: %.0f µs", verdict(r.P50Ms <= g.Value), g.Text, r.P50Ms*1000)
	case g.Vs != "":
		v, ok := get(g.Vs, g.Key)
		if !ok || v.OpsPerSec == 0 {
			return ""
		}
		x := r.OpsPerSec / v.OpsPerSec
		return fmt.Sprintf("%-7s %s: %.2fx %s (%.0f vs %.0f ops/s)", verdict(x >= g.Ratio), g.Text, x, g.Vs, r.OpsPerSec, v.OpsPerSec)
	}
	return ""
}

// printGoals prints a verdict for every goal the runs can answer.
func printGoals(w io.Writer, runs []Run) {
	var lines []string
	for _, g := range goals {
		if l := goalLine(g, runs); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "goals (this run):")
	for _, l := range lines {
		fmt.Fprintln(w, "  "+l)
	}
}
