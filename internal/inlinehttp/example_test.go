package inlinehttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/ursula-go/ursula/internal/inlinehttp"
)

// An http.Client whose HTTP/1.1 exchanges run in the calling goroutine. The fallback
// (here a clone of http.DefaultTransport) supplies the dialer, TLS settings, proxy rules
// and idle limits, and carries the requests the inline path leaves to it (through a
// proxy, Expect or Upgrade).
func Example() {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Proto, r.URL.Path)
	}))
	defer ts.Close()

	hc := &http.Client{Transport: inlinehttp.New(nil)}
	for range 2 { // the second request reuses the connection
		res, err := hc.Get(ts.URL + "/bucket/stream")
		if err != nil {
			panic(err)
		}
		b, _ := io.ReadAll(res.Body) // read to the end: the connection goes back to the pool
		res.Body.Close()
		fmt.Println(res.StatusCode, string(b))
	}
	// Output:
	// 200 HTTP/1.1 /bucket/stream
	// 200 HTTP/1.1 /bucket/stream
}
