package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ursula-go/ursula/internal/blake3seq"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

const backupUsage = `Usage:
  ursula backup create --from URL --to DIR|s3://bucket/prefix
  ursula backup verify DIR|s3://bucket/prefix
  ursula backup restore DIR|s3://bucket/prefix --to URL

URL is a node's client URL (http://host:port). create exports every group of the node's
engine (on a cluster, from each group's leader, each group consistent on its own) while
writes go on, and writes one object per group plus manifest.json with each object's size
and BLAKE3-256 checksum. Stream bytes held in the cold tier are copied into the backup.
verify re-reads every object and checks sizes, checksums and that each object decodes.
restore checks the backup the same way first, then installs every stream on the target as
a history rewrite: new Stream-Incarnation tokens, Stream-Previous-Incarnation and
Stream-Inherited-Offset on HEAD, producers closed with epoch-closed;by=history.

s3:// uses AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION and
AWS_ENDPOINT_URL (an S3-compatible endpoint). Progress goes to stderr on a terminal.
Each command exits 0 only on full success.
`

// backupFormatVersion is the manifest's format_version; restore refuses any other.
const backupFormatVersion = 1

const manifestName = "manifest.json"

// backupManifest is manifest.json.
type backupManifest struct {
	FormatVersion int            `json:"format_version"`
	ClusterID     string         `json:"cluster_id"`
	Engine        string         `json:"engine"`
	Source        string         `json:"source"`
	Created       string         `json:"created"` // RFC 3339
	Objects       []backupObject `json:"objects"`
}

// backupObject is one group's exported state.
type backupObject struct {
	Name    string            `json:"name"`
	Group   uint64            `json:"group"`
	Size    int64             `json:"size"`
	BLAKE3  string            `json:"blake3"` // BLAKE3-256, hex
	Streams int               `json:"streams"`
	Tails   map[string]string `json:"tails"` // stream key -> tail offset at export
}

func runBackup(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, backupUsage)
		return errors.New("need create, verify or restore")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet("backup "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, backupUsage) }
	from := fs.String("from", "", "the node to back up (create)")
	to := fs.String("to", "", "the backup location (create) or the target node (restore)")
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	var prog *backupProgress
	if isTerminal(stderr) {
		prog = &backupProgress{w: stderr, start: time.Now()}
	}
	switch args[0] {
	case "create":
		if *from == "" || *to == "" || len(pos) != 0 {
			fs.Usage()
			return errors.New("create needs --from URL --to DIR|s3://bucket/prefix")
		}
		st, err := openBackupStore(ctx, *to)
		if err != nil {
			return err
		}
		m, err := createBackup(ctx, *from, st, prog)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "backed up %d groups (%d streams) of %s to %s\n", len(m.Objects), m.streams(), *from, *to)
		return nil
	case "verify":
		if len(pos) != 1 {
			fs.Usage()
			return errors.New("verify needs DIR|s3://bucket/prefix")
		}
		st, err := openBackupStore(ctx, pos[0])
		if err != nil {
			return err
		}
		m, err := verifyBackup(ctx, st, prog, nil)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "backup %s is intact: %d objects, %d streams, created %s\n", pos[0], len(m.Objects), m.streams(), m.Created)
		return nil
	case "restore":
		if *to == "" || len(pos) != 1 {
			fs.Usage()
			return errors.New("restore needs DIR|s3://bucket/prefix --to URL")
		}
		st, err := openBackupStore(ctx, pos[0])
		if err != nil {
			return err
		}
		n, err := restoreBackup(ctx, st, *to, prog)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "restored %d streams from %s into %s\n", n, pos[0], *to)
		return nil
	}
	fs.Usage()
	return fmt.Errorf("unknown backup command %q", args[0])
}

func (m *backupManifest) streams() int {
	n := 0
	for _, o := range m.Objects {
		n += o.Streams
	}
	return n
}

// openBackupStore opens a directory or an s3://bucket/prefix location.
func openBackupStore(ctx context.Context, loc string) (coldstore.Store, error) {
	rest, ok := strings.CutPrefix(loc, "s3://")
	if !ok {
		if strings.Contains(loc, "://") {
			return nil, fmt.Errorf("%s: a backup location is a directory or s3://bucket/prefix", loc)
		}
		return coldstore.NewFS(loc)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	if bucket == "" {
		return nil, fmt.Errorf("%s: no bucket", loc)
	}
	cfg := coldstore.S3Config{
		Bucket: bucket, Prefix: strings.Trim(prefix, "/"),
		Region: os.Getenv("AWS_REGION"), Endpoint: os.Getenv("AWS_ENDPOINT_URL"),
		AccessKeyID: os.Getenv("AWS_ACCESS_KEY_ID"), SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken: os.Getenv("AWS_SESSION_TOKEN"),
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.Endpoint != "" {
		cfg.ServerSideEncryption = "none" // S3-compatible stores rarely implement SSE
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return coldstore.NewS3(ctx, cfg)
}

// adminGet GETs an admin path of a node, retrying while a group has no leader.
func adminGet(ctx context.Context, base, path string) ([]byte, error) {
	u := strings.TrimRight(base, "/") + path
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", u, err)
		}
		if res.StatusCode == http.StatusOK {
			return body, nil
		}
		if res.StatusCode == http.StatusServiceUnavailable && attempt < 30 {
			if err := sleepCtx(ctx, time.Second); err != nil {
				return nil, err
			}
			continue
		}
		return nil, fmt.Errorf("GET %s: %s: %s", u, res.Status, strings.TrimSpace(string(body)))
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func createBackup(ctx context.Context, from string, st coldstore.Store, prog *backupProgress) (*backupManifest, error) {
	body, err := adminGet(ctx, from, "/__ursula/backup/groups")
	if err != nil {
		return nil, err
	}
	var list server.BackupGroupList
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("group list: %w", err)
	}
	m := &backupManifest{FormatVersion: backupFormatVersion, ClusterID: list.ClusterID, Engine: list.Engine,
		Source: from, Created: time.Now().UTC().Format(time.RFC3339Nano)}
	prog.begin(len(list.Groups))
	for _, g := range list.Groups {
		data, err := adminGet(ctx, from, fmt.Sprintf("/__ursula/backup/groups/%d", g))
		if err != nil {
			return nil, fmt.Errorf("group %d: %w", g, err)
		}
		state, err := streamcore.ReadState(data)
		if err != nil {
			return nil, fmt.Errorf("group %d: the export does not decode: %w", g, err)
		}
		sum := blake3seq.Sum256(data)
		o := backupObject{Name: fmt.Sprintf("group-%05d.state", g), Group: g, Size: int64(len(data)),
			BLAKE3: hex.EncodeToString(sum[:]), Streams: len(state.Streams), Tails: map[string]string{}}
		for k, s := range state.Streams {
			o.Tails[k] = streamcore.FormatOffset(s.Tail())
		}
		if err := st.Put(ctx, o.Name, bytes.NewReader(data), o.Size); err != nil {
			return nil, fmt.Errorf("write %s: %w", o.Name, err)
		}
		m.Objects = append(m.Objects, o)
		prog.add(o.Size)
	}
	prog.finish()
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	// The manifest goes last: a backup without one is incomplete, never mistaken for whole.
	if err := st.Put(ctx, manifestName, bytes.NewReader(mb), int64(len(mb))); err != nil {
		return nil, fmt.Errorf("write %s: %w", manifestName, err)
	}
	return m, nil
}

// readManifest reads manifest.json and refuses another format version.
func readManifest(ctx context.Context, st coldstore.Store) (*backupManifest, error) {
	b, err := coldstore.ReadAll(ctx, st, manifestName, 0, -1)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", manifestName, err)
	}
	var m backupManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s is damaged: %w", manifestName, err)
	}
	if m.FormatVersion != backupFormatVersion {
		return nil, fmt.Errorf("%s has format_version %d; this build reads format_version %d only", manifestName, m.FormatVersion, backupFormatVersion)
	}
	seen := map[uint64]bool{}
	names := map[string]bool{}
	for _, o := range m.Objects {
		if seen[o.Group] || names[o.Name] || o.Name == manifestName || strings.Contains(o.Name, "/") {
			return nil, fmt.Errorf("%s lists group %d (%s) twice or under a bad name", manifestName, o.Group, o.Name)
		}
		seen[o.Group], names[o.Name] = true, true
	}
	return &m, nil
}

// verifyBackup checks every object of the backup: size, BLAKE3-256 and that it decodes to
// the streams and tails the manifest lists. each, when not nil, gets every decoded state.
// The error names every damaged object.
func verifyBackup(ctx context.Context, st coldstore.Store, prog *backupProgress, each func(backupObject, *streamcore.State) error) (*backupManifest, error) {
	m, err := readManifest(ctx, st)
	if err != nil {
		return nil, err
	}
	var damaged []string
	prog.begin(len(m.Objects))
	for _, o := range m.Objects {
		state, why := checkObject(ctx, st, o)
		if why != "" {
			damaged = append(damaged, fmt.Sprintf("%s: %s", o.Name, why))
			continue
		}
		prog.add(o.Size)
		if each != nil {
			if err := each(o, state); err != nil {
				return nil, err
			}
		}
	}
	prog.finish()
	if len(damaged) > 0 {
		return nil, fmt.Errorf("damaged backup object(s):\n  %s", strings.Join(damaged, "\n  "))
	}
	return m, nil
}

// checkObject reads one object and returns its state, or why it is damaged.
func checkObject(ctx context.Context, st coldstore.Store, o backupObject) (*streamcore.State, string) {
	data, err := coldstore.ReadAll(ctx, st, o.Name, 0, -1)
	if err != nil {
		return nil, "cannot be read: " + err.Error()
	}
	if int64(len(data)) != o.Size {
		return nil, fmt.Sprintf("size %d, manifest says %d", len(data), o.Size)
	}
	sum := blake3seq.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != o.BLAKE3 {
		return nil, fmt.Sprintf("BLAKE3 %s, manifest says %s", got, o.BLAKE3)
	}
	state, err := streamcore.ReadState(data)
	if err != nil {
		return nil, "does not decode: " + err.Error()
	}
	if len(state.Streams) != o.Streams {
		return nil, fmt.Sprintf("%d streams, manifest says %d", len(state.Streams), o.Streams)
	}
	for k, s := range state.Streams {
		if o.Tails[k] != streamcore.FormatOffset(s.Tail()) {
			return nil, fmt.Sprintf("stream %s ends at %d, manifest says %q", k, s.Tail(), o.Tails[k])
		}
	}
	return state, ""
}

// restoreBackup verifies the whole backup, then installs every stream on the target.
func restoreBackup(ctx context.Context, st coldstore.Store, to string, prog *backupProgress) (int, error) {
	// Nothing is written before every object checked out.
	m, err := verifyBackup(ctx, st, nil, nil)
	if err != nil {
		return 0, err
	}
	n := 0
	prog.begin(len(m.Objects))
	_, err = verifyBackup(ctx, st, nil, func(o backupObject, state *streamcore.State) error {
		keys := make([]string, 0, len(state.Streams))
		for k := range state.Streams {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if err := restoreOne(ctx, to, k, streamcore.EncodeStream(state.Streams[k])); err != nil {
				return fmt.Errorf("%s: stream %s: %w", o.Name, k, err)
			}
			n++
		}
		prog.add(o.Size)
		return nil
	})
	prog.finish()
	return n, err
}

// restoreOne posts one stream to the target; the node redirects to the stream's group
// leader, and a repeat of a restore that already applied is answered 200.
func restoreOne(ctx context.Context, to, key string, enc []byte) error {
	u := strings.TrimRight(to, "/") + "/__ursula/backup/restore?key=" + url.QueryEscape(key)
	for attempt := 0; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(enc))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set(server.HdrAdmin, "1") // a restore is an operator's explicit act
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		switch {
		case res.StatusCode == http.StatusCreated || res.StatusCode == http.StatusOK:
			return nil
		case res.StatusCode == http.StatusServiceUnavailable && attempt < 30:
			if err := sleepCtx(ctx, time.Second); err != nil {
				return err
			}
			continue
		}
		return fmt.Errorf("%s: %s", res.Status, strings.TrimSpace(string(body)))
	}
}

// backupProgress reports bytes and objects with a rate on a terminal (nil: quiet).
type backupProgress struct {
	w       io.Writer
	start   time.Time
	last    time.Time
	total   int
	objects int
	bytes   int64
	drawn   bool
}

func (p *backupProgress) begin(total int) {
	if p != nil {
		p.total, p.objects, p.bytes, p.start = total, 0, 0, time.Now()
	}
}

func (p *backupProgress) add(n int64) {
	if p == nil {
		return
	}
	p.objects++
	p.bytes += n
	if time.Since(p.last) < 100*time.Millisecond && p.objects < p.total {
		return
	}
	p.last = time.Now()
	rate := float64(p.bytes) / max(time.Since(p.start).Seconds(), 1e-3)
	fmt.Fprintf(p.w, "\r%d/%d objects, %s, %s/s   ", p.objects, p.total, human(uint64(p.bytes)), human(uint64(rate)))
	p.drawn = true
}

func (p *backupProgress) finish() {
	if p != nil && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
