package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

const exportUsage = `Usage: ursula export <stream-url> <out.db> [--at OFFSET|TIME|-DURATION] [--token-file F] [--ca-file F]

Writes a plain, self-contained SQLite file of the replicated database held by the
stream: at its tail, or as it was at an earlier commit (point-in-time export):
  --at OFFSET     a stream offset at a commit boundary (ursula log lists them)
  --at TIME       an RFC 3339 time: the last commit made at or before it
  --at -DURATION  that long before now, e.g. -10m or -2h30m
The export says which commit it used. A point the stream no longer retains is refused,
naming the earliest one it does. Nothing is claimed: the owner keeps writing
undisturbed. out.db is replaced atomically. Progress is drawn when stderr is a terminal.
--token-file and --ca-file (default $URSULA_VFS_TOKEN_FILE, $URSULA_VFS_CA_FILE) give a bearer
token and the CA certificates to trust for https:// URLs.
`

func runExport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, exportUsage) }
	at := fs.String("at", "", "offset, RFC 3339 time or -DURATION to export at (default: the tail)")
	cf := addClientFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fs.Usage()
		return fmt.Errorf("need a stream URL and an output file")
	}
	url, out := pos[0], pos[1]
	if err := replicator.CheckURL(url); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := cf.newClient()
	if err != nil {
		return err
	}
	var offset uint64
	used := ""
	if *at != "" {
		h, err := replicator.ReadHistory(ctx, c, url, streamcore.MaxRequestBytes, nil)
		if err != nil {
			return err
		}
		p, err := h.Resolve(*at, time.Now())
		if err != nil {
			return fmt.Errorf("--at %s: %w", *at, err)
		}
		offset, used = p.Offset, describePoint(p)
	}
	var bar *progressBar
	if isTerminal(stderr) {
		bar = &progressBar{w: stderr, start: time.Now()}
	}
	img, err := replicator.Restore(ctx, c, url, out, offset, streamcore.MaxRequestBytes, bar.update)
	bar.finish()
	if err != nil {
		return err
	}
	if err := rollbackJournalMode(out); err != nil {
		return err
	}
	if used == "" {
		used = "offset " + streamcore.FormatOffset(img.Tail)
	}
	fmt.Fprintf(stdout, "exported %s at %s: %d pages of %d bytes (%d commits replayed) -> %s\n",
		url, used, img.DBPages, img.PageSize, img.Commits, out)
	return nil
}

// rollbackJournalMode marks the file as a rollback-journal database (file format bytes 18
// and 19 = 1). A WAL-mode file needs a -wal and -shm beside it even to be read, so it
// cannot be opened read-only from read-only media; the export must be self-contained.
func rollbackJournalMode(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	var hdr [2]byte
	if _, err := f.ReadAt(hdr[:], 18); err == nil && hdr == [2]byte{2, 2} {
		_, err = f.WriteAt([]byte{1, 1}, 18)
		if err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// progressBar draws replay progress on a terminal.
type progressBar struct {
	w     io.Writer
	start time.Time
	last  time.Time
	drawn bool
}

func (p *progressBar) update(done, total uint64) {
	if p == nil || time.Since(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last = time.Now()
	frac := 1.0
	if total > 0 {
		frac = float64(done) / float64(total)
	}
	const width = 30
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r[%s%s] %5.1f%% %s / %s", strings.Repeat("#", n), strings.Repeat(" ", width-n), frac*100, human(done), human(total))
	p.drawn = true
}

func (p *progressBar) finish() {
	if p != nil && p.drawn {
		fmt.Fprintf(p.w, " (%s)\n", time.Since(p.start).Round(time.Millisecond))
	}
}

func human(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
