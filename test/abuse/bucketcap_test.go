package abuse

import (
	"fmt"
	"testing"

	"github.com/ursula-go/ursula/streamcore"
)

// TestStreamsPerBucketCap: past [limits] max_streams_per_bucket a new stream is refused
// with 429 STREAMS_PER_BUCKET_LIMIT and nothing is created; repeats of existing creates,
// other buckets and creates after a delete pass. On both engines.
func TestStreamsPerBucketCap(t *testing.T) {
	for _, eng := range []string{"memory", "raft"} {
		t.Run(eng, func(t *testing.T) {
			n := startConfig(t, t.TempDir(), "[server]\nengine = \""+eng+"\"\n[limits]\nmax_streams_per_bucket = 3\n")
			create := func(key string) int {
				res, _ := do(t, "PUT", n.url+"/"+key, nil, "Content-Type", "text/plain")
				return res.StatusCode
			}
			for i := 0; i < 3; i++ {
				if st := create(fmt.Sprintf("capped/s%d", i)); st != 201 {
					t.Fatalf("create %d: %d", i, st)
				}
			}
			res, b := do(t, "PUT", n.url+"/capped/s3", nil, "Content-Type", "text/plain")
			d, ok := streamcore.ParseErrorBody(b)
			if res.StatusCode != 429 || !ok || d.Code != "STREAMS_PER_BUCKET_LIMIT" {
				t.Fatalf("create past the cap: %d %s", res.StatusCode, b)
			}
			if res, _ := do(t, "HEAD", n.url+"/capped/s3", nil); res.StatusCode != 404 {
				t.Fatalf("a refused create made the stream: HEAD %d", res.StatusCode)
			}
			if st := create("capped/s0"); st/100 != 2 {
				t.Fatalf("repeat of an existing create: %d", st)
			}
			if st := create("another/s0"); st != 201 {
				t.Fatalf("create in another bucket: %d", st)
			}
			if res, b := do(t, "DELETE", n.url+"/capped/s1", nil); res.StatusCode/100 != 2 {
				t.Fatalf("delete: %d %s", res.StatusCode, b)
			}
			if st := create("capped/s3"); st != 201 {
				t.Fatalf("create after a delete: %d", st)
			}
			n.alive(t)
		})
	}
}
