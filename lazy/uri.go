package lazy

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// VFSName is the name the SQLite adapters outside package vfs register the lazy VFS
// under: file:NAME?vfs=ursula-lazy&url=STREAM_URL opens a stream lazily, read-only.
const VFSName = "ursula-lazy"

// URIParams names the SQLite URI parameters of a lazy open:
//
//	url       the stream URL (required); percent-encode '&', '#', '%' and '?' in it
//	at        the stream offset to read at: decimal, or the protocol's 20-digit form;
//	          default the tail when the database is opened
//	follow    1 (or true): follow the stream live, so each new read transaction sees the
//	          latest commits; not with at
//	cache_mb  the page cache bound in MiB (default 64)
var URIParams = []string{"url", "at", "follow", "cache_mb"}

// ParseURI reads the parameters of a lazy open through get (which returns "" for an
// absent parameter) and returns the stream URL and the Options (without a Client).
func ParseURI(get func(name string) string) (string, Options, error) {
	var o Options
	u := get("url")
	if u == "" {
		return "", o, fmt.Errorf("ursula-lazy: the URI has no url parameter (file:NAME?vfs=%s&url=STREAM_URL)", VFSName)
	}
	if s := get("at"); s != "" {
		at, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			if at, err = streamcore.ParseOffset(s); err != nil {
				return "", o, fmt.Errorf("ursula-lazy: at=%q is not a stream offset", s)
			}
		}
		o.At = at
	}
	switch strings.ToLower(get("follow")) {
	case "", "0", "false", "no", "off":
	case "1", "true", "yes", "on":
		o.Follow = true
	default:
		return "", o, fmt.Errorf("ursula-lazy: follow=%q: want 1 or 0", get("follow"))
	}
	if o.Follow && o.At != 0 {
		return "", o, fmt.Errorf("ursula-lazy: follow reads the tail; it cannot be combined with at")
	}
	if s := get("cache_mb"); s != "" {
		mb, err := strconv.ParseInt(s, 10, 64)
		if err != nil || mb <= 0 || mb > 1<<20 {
			return "", o, fmt.Errorf("ursula-lazy: cache_mb=%q: want a whole number of MiB in 1..1048576", s)
		}
		o.CacheBytes = mb << 20
	}
	return u, o, nil
}

// Pool shares Sources among the connections of one process that open the same stream
// with the same options: the first open indexes the stream, the others reuse its index
// and page cache (and its offset, unless it follows), and the last close closes it.
type Pool struct {
	Client *client.Client // nil: a default client

	mu sync.Mutex
	m  map[poolKey]*pooled
	by map[*Source]poolKey
}

type poolKey struct {
	url    string
	at     uint64
	follow bool
	cache  int64
}

type pooled struct {
	ready chan struct{}
	src   *Source
	err   error
	refs  int
}

// Acquire returns the shared source of url and opts, opening it if no connection holds
// it. Each successful Acquire needs one Release.
func (p *Pool) Acquire(ctx context.Context, url string, opts Options) (*Source, error) {
	k := poolKey{url, opts.At, opts.Follow, opts.CacheBytes}
	p.mu.Lock()
	if p.m == nil {
		p.m, p.by = map[poolKey]*pooled{}, map[*Source]poolKey{}
	}
	e := p.m[k]
	if e == nil {
		e = &pooled{ready: make(chan struct{})}
		p.m[k] = e
		p.mu.Unlock()
		opts.Client = p.Client
		e.src, e.err = Open(ctx, url, opts)
		p.mu.Lock()
		if e.err != nil {
			delete(p.m, k)
		} else {
			p.by[e.src] = k
		}
		close(e.ready)
	}
	e.refs++
	p.mu.Unlock()
	<-e.ready
	if e.err != nil {
		return nil, e.err
	}
	return e.src, nil
}

// Release drops one hold of src; the last one closes it.
func (p *Pool) Release(src *Source) {
	p.mu.Lock()
	k, ok := p.by[src]
	e := p.m[k]
	if !ok || e == nil || e.src != src {
		p.mu.Unlock()
		return
	}
	e.refs--
	last := e.refs == 0
	if last {
		delete(p.m, k)
		delete(p.by, src)
	}
	p.mu.Unlock()
	if last {
		src.Close()
	}
}
