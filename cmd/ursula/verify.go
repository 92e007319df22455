package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

const verifyUsage = `Usage: ursula verify <stream-url> [--every DURATION] [--metrics-listen ADDR] [--metrics-file PATH]

Proves the replicated database at stream-url is restorable: rebuilds it from its latest
snapshot plus the log, runs PRAGMA integrity_check, and compares it page for page with a
replay of the whole log while the stream still retains it. Prints the verified offset and
the time of the last commit in it; exits non-zero on damage. Claims nothing.

  --every 10m            verify again every interval until interrupted (failures are
                         reported and counted, and the next run still happens)
  --metrics-listen ADDR  serve Prometheus metrics at http://ADDR/metrics:
                         ursula_verify_last_ok_offset, ursula_verify_last_ok_timestamp_seconds,
                         ursula_verify_last_ok_commit_timestamp_seconds,
                         ursula_verify_runs_total, ursula_verify_failures_total
  --metrics-file PATH    write the same metrics to PATH after every run (for a textfile
                         collector); replaced atomically
`

// verifyMetrics are the Prometheus metrics of verification runs of one stream.
type verifyMetrics struct {
	stream string

	mu           sync.Mutex
	lastOK       uint64
	lastOKAt     time.Time
	lastOKCommit time.Time
	runs, fails  uint64
}

func (m *verifyMetrics) record(rep *vfs.VerifyReport, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runs++
	if rep == nil {
		m.fails++
		return
	}
	m.lastOK, m.lastOKAt, m.lastOKCommit = rep.Offset, at, rep.CommitTime
}

// write renders the metrics in the Prometheus text format.
func (m *verifyMetrics) write(w io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	label := `{stream=` + strconv.Quote(m.stream) + `}`
	secs := func(t time.Time) string {
		if t.IsZero() {
			return "0"
		}
		return strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 3, 64)
	}
	fmt.Fprintf(w, "# HELP ursula_verify_last_ok_offset Stream offset of the last successful verification.\n# TYPE ursula_verify_last_ok_offset gauge\nursula_verify_last_ok_offset%s %d\n", label, m.lastOK)
	fmt.Fprintf(w, "# HELP ursula_verify_last_ok_timestamp_seconds When the last successful verification finished.\n# TYPE ursula_verify_last_ok_timestamp_seconds gauge\nursula_verify_last_ok_timestamp_seconds%s %s\n", label, secs(m.lastOKAt))
	fmt.Fprintf(w, "# HELP ursula_verify_last_ok_commit_timestamp_seconds Commit time of the last commit the last successful verification covered.\n# TYPE ursula_verify_last_ok_commit_timestamp_seconds gauge\nursula_verify_last_ok_commit_timestamp_seconds%s %s\n", label, secs(m.lastOKCommit))
	fmt.Fprintf(w, "# HELP ursula_verify_runs_total Verification runs.\n# TYPE ursula_verify_runs_total counter\nursula_verify_runs_total%s %d\n", label, m.runs)
	fmt.Fprintf(w, "# HELP ursula_verify_failures_total Verification runs that found damage or could not finish.\n# TYPE ursula_verify_failures_total counter\nursula_verify_failures_total%s %d\n", label, m.fails)
}

func (m *verifyMetrics) writeFile(path string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".ursula-verify-metrics-")
	if err != nil {
		return err
	}
	m.write(tmp)
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func runVerify(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, verifyUsage) }
	every := fs.Duration("every", 0, "verify again every interval")
	listen := fs.String("metrics-listen", "", "serve Prometheus metrics on this address")
	metricsFile := fs.String("metrics-file", "", "write Prometheus metrics to this file after every run")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("need one stream URL")
	}
	url := pos[0]
	if err := replicator.CheckURL(url); err != nil {
		return err
	}
	if *every < 0 {
		return fmt.Errorf("--every must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	m := &verifyMetrics{stream: url}
	if *listen != "" {
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			m.write(w)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		fmt.Fprintf(stderr, "verify metrics at http://%s/metrics\n", ln.Addr())
	}
	for {
		rep, err := vfs.Verify(ctx, url, "")
		m.record(rep, time.Now())
		if *metricsFile != "" {
			if werr := m.writeFile(*metricsFile); werr != nil {
				fmt.Fprintf(stderr, "ursula verify: writing %s: %v\n", *metricsFile, werr)
			}
		}
		if err == nil {
			fmt.Fprintln(stdout, describeVerify(url, rep))
		}
		if *every == 0 {
			return err
		}
		if err != nil {
			fmt.Fprintf(stderr, "ursula verify: %s: %v\n", time.Now().UTC().Format(time.RFC3339), err)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		case <-time.After(*every):
		}
	}
}

func describeVerify(url string, rep *vfs.VerifyReport) string {
	when := "commit time not recorded"
	if !rep.CommitTime.IsZero() {
		when = "last commit " + rep.CommitTime.Format(time.RFC3339Nano)
	}
	how := "a replay of the whole log"
	if rep.SnapshotOffset != 0 {
		how = "the snapshot at " + streamcore.FormatOffset(rep.SnapshotOffset) + " plus the log"
	}
	cmp := "agrees with a replay of the whole log"
	if !rep.Compared {
		cmp = "not compared: " + rep.NotCompared
	}
	return fmt.Sprintf("verified %s at offset %s (%s): rebuilt from %s, %d pages, integrity ok, %s",
		url, streamcore.FormatOffset(rep.Offset), when, how, rep.DBPages, cmp)
}
