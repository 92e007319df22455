package main

import (
	"net/http/httptest"
	"testing"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/server"
)

// The scale subcommands against a real server over loopback, at a small size: the
// streams exist afterwards, the idle readers all subscribe and all get the message, and
// the memory figures come from the admin listener's metrics.
func TestScaleSubcommands(t *testing.T) {
	eng := engine.NewMemory(0)
	srv := server.New(eng, server.Config{ClusterID: "bench-test"})
	ts := httptest.NewServer(srv)
	admin := httptest.NewServer(srv.AdminHandler())
	t.Cleanup(func() { ts.Close(); admin.Close(); eng.Close() })
	metrics := admin.URL + "/__ursula/metrics"
	if rc := streamsCmd([]string{"--url", ts.URL + "/scale", "--streams", "40", "--concurrency", "8", "--metrics", metrics}); rc != 0 {
		t.Fatalf("streams exited %d", rc)
	}
	if n := eng.Stats().Streams; n != 40 {
		t.Fatalf("%d streams held, want 40", n)
	}
	if rc := sseIdleCmd([]string{"--url", ts.URL + "/scale", "--readers", "30", "--streams", "3", "--hold", "0s", "--metrics", metrics}); rc != 0 {
		t.Fatalf("sse-idle exited %d", rc)
	}
	if rc := memoryCmd([]string{"--metrics", metrics}); rc != 0 {
		t.Fatalf("memory exited %d", rc)
	}
	// A server that refuses: the subcommand fails.
	if rc := streamsCmd([]string{"--url", ts.URL + "/__bad", "--streams", "2"}); rc == 0 {
		t.Fatal("streams succeeded against refusals")
	}
}
