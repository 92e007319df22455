package testserver

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"testing"
)

// Loop calls step(0), step(1), ... in a goroutine until step returns false or the
// returned stop is called; stop waits for the goroutine to end. Tests use it for a writer
// that keeps appending while the step under test runs.
func Loop(step func(i int) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			if !step(i) {
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }); wg.Wait() }
}

// Do sends one request with the default client (which follows redirects) and returns the
// answer with its whole body; hdr holds header name, value pairs. Failing to send fails
// the test.
func Do(t testing.TB, method, url string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res, b
}
