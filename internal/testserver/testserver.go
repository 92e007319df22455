// Package testserver starts the real stream server in process for tests and examples: the
// server package on the memory engine, over real HTTP on loopback (httptest), optionally
// with a cold tier. It is the one helper every package's tests use to get a server; the
// server package's own tests (which cannot import it) have their own.
package testserver

import (
	"log"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/server"
)

// Options shape a test server. The zero value is a plain memory-engine server.
type Options struct {
	// ClusterID is the server's Ursula-Cluster-Id ("test" when empty).
	ClusterID string
	// Wrap, when set, wraps the server's handler (a proxy, a recorder).
	Wrap func(http.Handler) http.Handler
	// Cold, when set, is the cold tier's store, configured by ColdConfig (or
	// DefaultColdConfig("fs", 1 MiB) when ColdConfig is nil).
	Cold       coldstore.Store
	ColdConfig *coldstore.Config
}

// Server is a running test server.
type Server struct {
	URL    string // base URL, no trailing slash
	Server *server.Server
	Engine *engine.Memory
	ts     *httptest.Server
}

// DefaultColdConfig is the cold-tier configuration tests use: fast flushes of flushSize
// chunks, GC every second with an hour of grace (nothing referenced recently is deleted).
func DefaultColdConfig(backend string, flushSize int64) coldstore.Config {
	return coldstore.Config{Backend: backend, Dir: "unused", Root: "root",
		FlushInterval: coldstore.Duration(20 * time.Millisecond), FlushSize: coldstore.Size(flushSize),
		FlushMaxConcurrency: 4, GCInterval: coldstore.Duration(time.Second), GCGrace: coldstore.Duration(time.Hour)}
}

// Start starts a server and stops it when tb's test ends.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	s, err := start(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// StartExample starts a server for an Example function (which has no testing.TB); the
// caller stops it with Close.
func StartExample(o Options) *Server {
	s, err := start(o)
	if err != nil {
		log.Fatal(err)
	}
	return s
}

func start(o Options) (*Server, error) {
	if o.ClusterID == "" {
		o.ClusterID = "test"
	}
	eng := engine.NewMemory(0)
	srv := server.New(eng, server.Config{ClusterID: o.ClusterID})
	if o.Cold != nil {
		cfg := DefaultColdConfig("fs", 1<<20)
		if o.ColdConfig != nil {
			cfg = *o.ColdConfig
		}
		if err := srv.EnableCold(o.Cold, cfg, server.ColdOptions{BackoffMax: 300 * time.Millisecond}); err != nil {
			eng.Close()
			return nil, err
		}
	}
	var h http.Handler = srv
	if o.Wrap != nil {
		h = o.Wrap(h)
	}
	ts := httptest.NewServer(h)
	return &Server{URL: ts.URL, ts: ts, Server: srv, Engine: eng}, nil
}

// Close stops the server, its cold tier and its engine.
func (s *Server) Close() {
	s.ts.Close()
	s.Server.StopCold()
	s.Engine.Close()
}
