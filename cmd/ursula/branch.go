package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

const branchUsage = `Usage: ursula branch <src-url>[@OFFSET|@TIME|@-DURATION] <dst-url>

Creates the database stream dst-url as a writable copy of the database at src-url as it
was at a commit (default: now): OFFSET is a commit offset (ursula log lists them), TIME an
RFC 3339 time (the last commit at or before it), -DURATION that long ago (e.g. @-10m).
The branch is a fork of the source's stream: the server shares the bytes instead of
copying them. Open it like any database; the source and its owner are not touched.
`

func runBranch(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("branch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, branchUsage) }
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fs.Usage()
		return fmt.Errorf("need a source and a destination stream URL")
	}
	src, at := splitAt(pos[0])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.New("")
	if err != nil {
		return err
	}
	p, err := replicator.Branch(ctx, c, src, at, pos[1], streamcore.MaxRequestBytes)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "branched %s at the %s -> %s\n", src, describePoint(p), pos[1])
	return nil
}

// splitAt splits "URL@AS-OF" at the last '@' after the host (an '@' before the path is
// user info).
func splitAt(s string) (url, at string) {
	hostEnd := 0
	if i := strings.Index(s, "://"); i >= 0 {
		if j := strings.IndexByte(s[i+3:], '/'); j >= 0 {
			hostEnd = i + 3 + j
		}
	}
	if i := strings.LastIndexByte(s, '@'); i > hostEnd {
		return s[:i], s[i+1:]
	}
	return s, ""
}
