package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

const logUsage = `Usage: ursula log <stream-url> [--json]

Lists what the stream of a replicated database retains, oldest first: one line per commit
and per snapshot, starting with the offset (the one export --at and branch take) and the
RFC 3339 commit time, then the kind, the size in bytes, the pages written (snapshots: the
database size in pages) and the owner's epoch. --json prints one JSON object per line.
`

// historyLine is one line of ursula log --json.
type historyLine struct {
	Offset  string `json:"offset"`
	Time    string `json:"time"` // "" when the record carries no time
	Kind    string `json:"kind"` // "commit" or "snapshot"
	Size    int64  `json:"size"`
	Pages   int    `json:"pages"`
	DBPages uint32 `json:"db_pages"`
	Epoch   uint64 `json:"epoch"`
}

func runLog(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("log", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, logUsage) }
	asJSON := fs.Bool("json", false, "one JSON object per line")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fs.Usage()
		return fmt.Errorf("need one stream URL")
	}
	if err := replicator.CheckURL(pos[0]); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.New("")
	if err != nil {
		return err
	}
	h, err := replicator.ReadHistory(ctx, c, pos[0], streamcore.MaxRequestBytes, nil)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	emit := func(e replicator.HistoryEntry) error {
		l := historyLine{Offset: streamcore.FormatOffset(e.Offset), Kind: "commit", Size: e.Size, Pages: e.Pages, DBPages: e.DBPages, Epoch: e.Epoch}
		if e.Snapshot {
			l.Kind = "snapshot"
		}
		if e.UnixNano != 0 {
			l.Time = e.Time().Format(time.RFC3339Nano)
		}
		if *asJSON {
			return enc.Encode(l)
		}
		t := l.Time
		if t == "" {
			t = "unknown-time"
		}
		_, err := fmt.Fprintf(stdout, "%s %-35s %-8s %10d bytes %6d pages %8d db_pages epoch %d\n", l.Offset, t, l.Kind, l.Size, l.Pages, l.DBPages, l.Epoch)
		return err
	}
	snapDone := h.Snapshot == nil
	for _, e := range h.Commits {
		if !snapDone && h.Snapshot.Offset < e.Offset {
			if err := emit(*h.Snapshot); err != nil {
				return err
			}
			snapDone = true
		}
		if err := emit(e); err != nil {
			return err
		}
	}
	if !snapDone {
		return emit(*h.Snapshot)
	}
	return nil
}

// parseInterspersed parses flags that may come before, between or after the positional
// arguments, and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	return pos, nil
}

// describePoint says which commit an "as of" resolved to, for the user.
func describePoint(p replicator.Point) string {
	kind := "commit"
	if p.Entry.Snapshot {
		kind = "snapshot"
	}
	t := "time not recorded"
	if p.Entry.UnixNano != 0 {
		t = p.Entry.Time().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("%s at offset %s (%s)", kind, streamcore.FormatOffset(p.Offset), t)
}

// databaseCommands are the subcommands about a replicated database's history.
func databaseCommands() map[string]func(args []string, stdout, stderr io.Writer) error {
	return map[string]func(args []string, stdout, stderr io.Writer) error{
		"log":    runLog,
		"branch": runBranch,
		"verify": runVerify,
		"backup": runBackup,
	}
}
