// Command ursula runs the Ursula Durable Streams server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ursula-go/ursula/server"
)

const usage = `ursula: a Durable Streams server (HTTP append-only streams with snapshots,
retention, idempotent producers and live reads), the home of replicated SQLite databases.

Usage:
  ursula server [--listen ADDR] [--data DIR] [--config FILE] [--engine memory]
  ursula export <stream-url> <out.db> [--at OFFSET]
  ursula help

Commands:
  server   Run the stream server until SIGINT or SIGTERM (graceful: in-flight requests finish).
  export   Write a plain SQLite file of a replicated database, at the tail or at an offset.

Server flags (flags override the config file):
  --listen ADDR    address to listen on (config server.listen; default 127.0.0.1:4437)
  --data DIR       data directory; holds the persisted cluster id (default ./ursula-data)
  --config FILE    TOML config file, e.g.
                       [server]
                       listen = "127.0.0.1:4437"
                       cluster_id = "my-cluster"
                       data_dir = "./ursula-data"
                       engine = "memory"
  --cpuprofile F   write a Go CPU profile to F until shutdown (for performance work)
  --engine NAME    storage engine: "memory" (streams live in process memory and are lost
                   on exit). The persistent raft engine comes with the multi-Raft work.

Try it:
  ursula server &
  curl -X PUT -H 'Content-Type: text/plain' http://127.0.0.1:4437/demo/hello
  curl -X POST -H 'Content-Type: text/plain' --data 'hi' http://127.0.0.1:4437/demo/hello
  curl 'http://127.0.0.1:4437/demo/hello?offset=-1'

Endpoints: streams at /{bucket}/{stream}, the reference-server family at /v1/stream/{path},
readiness at /__ursula/ready, metrics at /__ursula/metrics (JSON) and /metrics (Prometheus).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	case "export":
		if err := runExport(args[1:], stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "ursula export: %v\n", err)
			return 1
		}
		return 0
	case "server":
		if err := runServer(args[1:], stderr); err != nil {
			fmt.Fprintf(stderr, "ursula server: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "ursula: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// fileConfig is the TOML config file.
type fileConfig struct {
	Server struct {
		Listen    string `toml:"listen"`
		ClusterID string `toml:"cluster_id"`
		DataDir   string `toml:"data_dir"`
		Engine    string `toml:"engine"`
	} `toml:"server"`
}

func runServer(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	listen := fs.String("listen", "", "address to listen on")
	data := fs.String("data", "", "data directory")
	config := fs.String("config", "", "TOML config file")
	engine := fs.String("engine", "", "storage engine")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file until shutdown")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var fc fileConfig
	if *config != "" {
		md, err := toml.DecodeFile(*config, &fc)
		if err != nil {
			return fmt.Errorf("config %s: %w", *config, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			keys := make([]string, len(und))
			for i, k := range und {
				keys[i] = k.String()
			}
			return fmt.Errorf("config %s: unknown keys: %s", *config, strings.Join(keys, ", "))
		}
	}
	pick := func(flagVal, fileVal, def string) string {
		if flagVal != "" {
			return flagVal
		}
		if fileVal != "" {
			return fileVal
		}
		return def
	}
	addr := pick(*listen, fc.Server.Listen, "127.0.0.1:4437")
	dataDir := pick(*data, fc.Server.DataDir, "./ursula-data")
	engineName := pick(*engine, fc.Server.Engine, "memory")
	if engineName != "memory" {
		return fmt.Errorf("engine %q is not available; this build has: memory", engineName)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	clusterID := fc.Server.ClusterID
	if clusterID != "" && !validClusterID(clusterID) {
		return fmt.Errorf("config server.cluster_id %q: use 1 to 64 characters of A-Z a-z 0-9 . _ -", clusterID)
	}
	if clusterID == "" {
		id, err := loadClusterID(dataDir)
		if err != nil {
			return err
		}
		clusterID = id
	}
	eng := server.NewMemoryEngine(10 * time.Second)
	defer eng.Close()
	srv := server.New(eng, server.Config{ClusterID: clusterID, Logger: logger})

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	// Live reads (long-poll, SSE) watch the base context, so a shutdown ends them at once
	// instead of waiting for their timeouts.
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		BaseContext: func(net.Listener) context.Context { return baseCtx }}
	hs.RegisterOnShutdown(cancelBase)
	logger.Info("ursula listening", "addr", ln.Addr().String(), "engine", engineName, "cluster_id", clusterID, "data", dataDir)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	srv.SetReady(false)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func validClusterID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// loadClusterID reads DIR/cluster-id, creating it on first start (checklist-protocol 3.5).
func loadClusterID(dir string) (string, error) {
	p := filepath.Join(dir, "cluster-id")
	if b, err := os.ReadFile(p); err == nil {
		id := strings.TrimSpace(string(b))
		if !validClusterID(id) {
			return "", fmt.Errorf("%s holds %q, which is not a valid cluster id; fix or remove the file", p, id)
		}
		return id, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	id := server.NewClusterID()
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("write cluster id: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("write cluster id: %w", err)
	}
	return id, nil
}
