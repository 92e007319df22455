package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
	"time"
)

// referenceLabel is the label run.sh gives the reference Node server. When both the
// baseline and the new runs have it, every other target's figures are also compared
// relative to it: on a shared machine the absolute numbers move with the load of the other
// jobs, and the reference server measured in the same run moves with them.
const referenceLabel = "reference"

// regressionFactor: a figure is a regression when it is worse than the baseline by more
// than 20% (throughput below 0.8x, or latency above 1/0.8 = 1.25x).
const regressionFactor = 0.8

// baselineFile is the committed baseline, test/bench/baseline.json.
type baselineFile struct {
	Comment string    `json:"comment"`
	Written time.Time `json:"written"`
	Runs    []Run     `json:"runs"`
}

const baselineComment = "Regression baseline of make bench (test/bench/run.sh). Refresh it from a run on a quiet machine: BENCH_WRITE_BASELINE=1 make bench, or ursula-bench baseline --write --file test/bench/baseline.json RESULTS/*.json"

// guardedMetrics are the figures that can raise a REGRESSION line; p99 is printed but too
// noisy on a shared 2-core machine to guard.
var guardedMetrics = []string{"ops/s", "p50"}

func baseline(args []string) int {
	fs := flag.NewFlagSet("baseline", flag.ExitOnError)
	file := fs.String("file", "test/bench/baseline.json", "the baseline file")
	write := fs.Bool("write", false, "replace the baseline file with these runs instead of comparing")
	fs.Parse(args)
	if fs.NArg() < 1 {
		fmt.Fprint(os.Stderr, "usage: ursula-bench baseline [--write] --file BASELINE.json A.json [B.json ...]\n")
		return 2
	}
	runs, err := loadRuns(fs.Args())
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench baseline: %v\n", err)
		return 1
	}
	if *write {
		doc, _ := json.MarshalIndent(baselineFile{Comment: baselineComment, Written: time.Now().UTC(), Runs: runs}, "", "  ")
		if err := os.WriteFile(*file, append(doc, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "ursula-bench baseline: %v\n", err)
			return 1
		}
		fmt.Printf("baseline written: %s (%d runs)\n", *file, len(runs))
		return 0
	}
	raw, err := os.ReadFile(*file)
	var base baselineFile
	if err == nil {
		err = json.Unmarshal(raw, &base)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench baseline: %s: %v\n", *file, err)
		return 1
	}
	fmt.Printf("against the baseline %s of %s; now/baseline (ops/s: higher is better, latency: lower is better)\n",
		*file, base.Written.Format("2006-01-02 15:04"))
	baseRun := func(label string) (Run, bool) {
		i := slices.IndexFunc(base.Runs, func(r Run) bool { return r.Label == label })
		if i < 0 {
			return Run{}, false
		}
		return base.Runs[i], true
	}
	nowRef, haveNowRef := Run{}, false
	if i := slices.IndexFunc(runs, func(r Run) bool { return r.Label == referenceLabel }); i >= 0 {
		nowRef, haveNowRef = runs[i], true
	}
	baseRef, haveBaseRef := baseRun(referenceLabel)
	normalize := haveNowRef && haveBaseRef

	var regressions []string
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "target\tscenario\tmetric\tnow\tbaseline\tnow/base\tvs reference\t\n")
	for _, run := range runs {
		old, ok := baseRun(run.Label)
		if !ok {
			fmt.Fprintf(tw, "%s\t(not in the baseline)\t\t\t\t\t\t\n", run.Label)
			continue
		}
		for _, res := range run.Results {
			key := res.key()
			was, ok := findResult(old, key)
			if !ok {
				continue
			}
			for _, m := range metrics {
				if m.name == "errors" || m.name == "p99.9" {
					continue
				}
				now, then := m.get(res), m.get(was)
				if now == 0 || then == 0 {
					continue
				}
				ratio := now / then
				// rel: the change relative to the reference server's own change in the
				// same scenario (1 = as fast as before, against the yardstick).
				rel, haveRel := 0.0, false
				if normalize && run.Label != referenceLabel {
					nr, ok1 := findResult(nowRef, key)
					br, ok2 := findResult(baseRef, key)
					if ok1 && ok2 && m.get(nr) > 0 && m.get(br) > 0 {
						rel, haveRel = ratio/(m.get(nr)/m.get(br)), true
					}
				}
				fmtV := func(v float64) string {
					if m.ms {
						return fmtMs(v)
					}
					return fmt.Sprintf("%.0f", v)
				}
				relText := "-"
				if haveRel {
					relText = fmt.Sprintf("%.2fx", rel)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2fx\t%s\t\n", run.Label, key, m.name, fmtV(now), fmtV(then), ratio, relText)
				if run.Label == referenceLabel || !slices.Contains(guardedMetrics, m.name) {
					continue
				}
				// The guarded change: relative to the reference when it was measured in
				// both runs, else absolute. Latency is inverted so that < 1 is worse.
				change := ratio
				if haveRel {
					change = rel
				}
				if m.ms {
					change = 1 / change
				}
				if change < regressionFactor {
					how := "absolute"
					if haveRel {
						how = fmt.Sprintf("relative to the reference server; absolute %.2fx", ratio)
					}
					regressions = append(regressions, fmt.Sprintf("REGRESSION: %s %s %s: %s now, %s in the baseline (%.0f%% worse, %s)",
						run.Label, key, m.name, fmtV(now), fmtV(then), (1-change)*100, how))
				}
			}
		}
	}
	tw.Flush()
	if normalize {
		fmt.Println(`"vs reference": now/base divided by the reference server's own now/base in the same scenario (machine speed divided out)`)
	}
	for _, r := range regressions {
		fmt.Println(r)
	}
	if len(regressions) == 0 {
		fmt.Printf("no figure more than %.0f%% worse than the baseline\n", (1-regressionFactor)*100)
	}
	return 0
}
