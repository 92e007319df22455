package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
)

// merge combines rounds of one target (runs with the same label, taken at different times
// of one bench run, interleaved with the other targets' rounds) into one run whose every
// figure is the median of that figure over the rounds: a slow minute of the machine then
// moves every target alike, and one odd round moves none.
func merge(args []string) int {
	fs := flag.NewFlagSet("merge", flag.ExitOnError)
	out := fs.String("out", "", "write the merged run here (required)")
	fs.Parse(args)
	if *out == "" || fs.NArg() < 1 {
		fmt.Fprint(os.Stderr, "usage: ursula-bench merge --out MERGED.json ROUND1.json [ROUND2.json ...]\n")
		return 2
	}
	runs, err := loadRuns(fs.Args())
	if err == nil {
		var m Run
		if m, err = mergeRuns(runs); err == nil {
			doc, _ := json.MarshalIndent(m, "", "  ")
			err = os.WriteFile(*out, append(doc, '\n'), 0o644)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench merge: %v\n", err)
		return 1
	}
	return 0
}

// mergeRuns is merge on loaded runs. Every run must carry the same label; a scenario
// missing from some rounds is the median of the rounds that have it. Errors add up over
// the rounds (an error in any round is reported), the first error message is kept.
func mergeRuns(runs []Run) (Run, error) {
	if len(runs) == 0 {
		return Run{}, fmt.Errorf("no runs to merge")
	}
	m := runs[0]
	m.Results = nil
	for _, r := range runs[1:] {
		if r.Label != m.Label {
			return Run{}, fmt.Errorf("runs of %q and %q cannot be merged: one target's rounds only", m.Label, r.Label)
		}
		if r.Started.Before(m.Started) {
			m.Started = r.Started
		}
	}
	for _, key := range resultKeys(runs) {
		var rs []Result
		for _, r := range runs {
			if res, ok := findResult(r, key); ok {
				rs = append(rs, res)
			}
		}
		med := func(f func(Result) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			return median(v)
		}
		out := rs[0]
		out.Rounds = len(rs)
		out.Seconds = med(func(r Result) float64 { return r.Seconds })
		out.OpsPerSec = med(func(r Result) float64 { return r.OpsPerSec })
		out.MBPerSec = med(func(r Result) float64 { return r.MBPerSec })
		out.P50Ms = med(func(r Result) float64 { return r.P50Ms })
		out.P99Ms = med(func(r Result) float64 { return r.P99Ms })
		out.P999Ms = med(func(r Result) float64 { return r.P999Ms })
		out.MaxMs = med(func(r Result) float64 { return r.MaxMs })
		out.MeanMs = med(func(r Result) float64 { return r.MeanMs })
		out.Ops = int64(med(func(r Result) float64 { return float64(r.Ops) }))
		out.Sent = int64(med(func(r Result) float64 { return float64(r.Sent) }))
		out.Errors, out.FirstError = 0, ""
		for _, r := range rs {
			out.Errors += r.Errors
			if out.FirstError == "" {
				out.FirstError = r.FirstError
			}
		}
		m.Results = append(m.Results, out)
	}
	return m, nil
}

// median of v (the mean of the middle two for an even count); v is reordered.
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
