package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/streamcore"
)

// The collector: every storage.cold.gc_interval it lists the cluster's objects and
// compares them with the objects the engine's streams reference (chunks, snapshot
// bodies). An object nobody references (below retention, of a deleted stream, a
// superseded snapshot body, an upload whose record was refused) is deleted once it has
// been seen unreferenced for storage.cold.gc_grace (default 5 minutes), and never while a
// read in flight has it pinned. Upload in progress are pinned by the flusher.
//
// Replicated engines (ColdCollectorGate): the collector runs on one node at a time (the
// raft engine: the leader of group 0, while its replicas have applied what they know to
// be committed); its references are those of every local replica, led or followed. Before
// deleting, it asks every other voter (POST /__ursula/cold-refs) which candidates one of
// its replicas references or one of its reads or uploads pins; a candidate any voter
// still needs is kept, and when a voter does not answer nothing is deleted in that pass.
// So no object is deleted while any reachable replica references it, and an unreachable
// voter stops collection. A node that stops being the collector forgets its marks.

func (c *coldTier) gcLoop() {
	t := time.NewTicker(c.cfg.GCInterval.D())
	defer t.Stop()
	unref := map[string]time.Time{}
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		if g, ok := c.eng.(ColdCollectorGate); ok && !g.ColdCollectHere() {
			clear(unref)
			continue
		}
		c.collect(unref, time.Now())
	}
}

// collect runs one pass; unref remembers since when each object was seen unreferenced.
func (c *coldTier) collect(unref map[string]time.Time, now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var listed []coldstore.ObjectInfo
	if err := c.store.List(ctx, c.root, func(o coldstore.ObjectInfo) bool {
		listed = append(listed, o)
		return true
	}); err != nil {
		return
	}
	// References are taken after the listing: an object recorded meanwhile is referenced.
	refs := map[string]bool{}
	c.eng.ColdRefs(func(k string) { refs[k] = true })
	seen := make(map[string]bool, len(listed))
	var due []string
	partsSwept := false
	for _, o := range listed {
		k := o.Key
		seen[k] = true
		if c.isPart(k) {
			// Staged snapshot parts are referenced by no state: a part no commit used
			// goes once it is older than storage.cold.parts_grace.
			if now.Sub(o.ModTime) >= c.cfg.PartsGrace.D() && !c.pinned(k) {
				due = append(due, k)
				partsSwept = true
			}
			continue
		}
		if refs[k] || c.pinned(k) {
			delete(unref, k)
			continue
		}
		since, ok := unref[k]
		if !ok {
			unref[k] = now
			continue
		}
		if now.Sub(since) >= c.cfg.GCGrace.D() {
			due = append(due, k)
		}
	}
	for k := range unref {
		if !seen[k] {
			delete(unref, k)
		}
	}
	if g, ok := c.eng.(ColdCollectorGate); ok && len(due) > 0 {
		needed, err := askPeersColdRefs(ctx, g.ColdPeers(), due)
		if err != nil {
			return // a voter did not answer: delete nothing this pass
		}
		kept := due[:0]
		for _, k := range due {
			if needed[k] {
				delete(unref, k)
			} else {
				kept = append(kept, k)
			}
		}
		due = kept
	}
	if partsSwept {
		defer c.parts.relistAll()
	}
	for _, k := range due {
		if c.pinned(k) {
			continue
		}
		if c.store.Delete(ctx, k) == nil {
			c.gcDeleted.Add(1)
			delete(unref, k)
		}
	}
}

// coldRefsClient asks the other voters about collection candidates.
var coldRefsClient = &http.Client{Timeout: 15 * time.Second}

// askPeersColdRefs returns the candidates some peer still references or pins; an error
// when any peer did not answer.
func askPeersColdRefs(ctx context.Context, peers, keys []string) (map[string]bool, error) {
	needed := map[string]bool{}
	for _, p := range peers {
		for i := 0; i < len(keys); i += 1000 {
			batch := keys[i:min(i+1000, len(keys))]
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(p, "/")+"/__ursula/cold-refs",
				strings.NewReader(strings.Join(batch, "\n")))
			if err != nil {
				return nil, err
			}
			req.Header.Set("Content-Type", "text/plain")
			res, err := coldRefsClient.Do(req)
			if err != nil {
				return nil, err
			}
			b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
			res.Body.Close()
			if err != nil {
				return nil, err
			}
			if res.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("%s: cold-refs answered %s", p, res.Status)
			}
			for _, k := range strings.Split(string(b), "\n") {
				if k != "" {
					needed[k] = true
				}
			}
		}
	}
	return needed, nil
}

// handleColdRefs serves POST /__ursula/cold-refs: the body lists object keys, one a line;
// the answer lists those a local replica references or a read or upload in flight here
// pins (the collector of another node asks before deleting).
func (s *Server) handleColdRefs(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.methodNotAllowed(w, r, "POST")
		return
	}
	c := s.cold
	if c == nil {
		drainBody(r)
		s.writeError(w, r, streamcore.Errorf(http.StatusNotImplemented, streamcore.CodeNoColdStore, "this server has no cold store"))
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "reading the body: %s", err))
		return
	}
	asked := map[string]bool{}
	for _, k := range strings.Split(string(b), "\n") {
		if k != "" {
			asked[k] = true
		}
	}
	var out strings.Builder
	c.eng.ColdRefs(func(k string) {
		if asked[k] {
			delete(asked, k)
			out.WriteString(k)
			out.WriteByte('\n')
		}
	})
	for k := range asked {
		if c.pinned(k) {
			out.WriteString(k)
			out.WriteByte('\n')
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, out.String())
}
