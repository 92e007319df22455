package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/client"
)

// A client creates a stream, appends to it with an idempotent producer and reads it
// back. Repeating an append with the same producer key is answered as a duplicate and
// adds nothing, which is what makes a retry after an unknown outcome safe.
func Example() {
	ts := testserver.StartExample(testserver.Options{ClusterID: "client-example"})
	defer ts.Close()
	ctx := context.Background()

	c, err := client.New(ts.URL + "/")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Create(ctx, "logs/app", client.CreateOptions{ContentType: "text/plain"}); err != nil {
		log.Fatal(err)
	}
	key := &client.ProducerKey{ID: "writer-1", Epoch: 1, Seq: 0}
	opts := client.AppendOptions{ContentType: "text/plain", Producer: key, Digest: true}
	if _, err := c.Append(ctx, "logs/app", []byte("hello "), opts); err != nil {
		log.Fatal(err)
	}
	again, err := c.Append(ctx, "logs/app", []byte("hello "), opts) // a retry of the same write
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("duplicate:", again.Duplicate)
	key.Seq++
	if _, err := c.Append(ctx, "logs/app", []byte("world"), opts); err != nil {
		log.Fatal(err)
	}
	r, err := c.Read(ctx, "logs/app", client.ReadOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", r.Data)
	// Output:
	// duplicate: true
	// hello world
}

// A failed request is a *client.Error. Its Outcome says what the answer proves about a
// write: NotApplied (here a 404: nothing was ever created under /logs) means nothing was written
// and never will be; Unknown means the write may have applied, and only a repeat with the
// same producer key settles it.
func ExampleError() {
	ts := testserver.StartExample(testserver.Options{ClusterID: "client-example"})
	defer ts.Close()

	c, err := client.New(ts.URL + "/")
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Append(context.Background(), "logs/app", []byte("x"), client.AppendOptions{ContentType: "text/plain"})
	var ce *client.Error
	if errors.As(err, &ce) {
		fmt.Println("status:", ce.Status)
		fmt.Println("code:", ce.Code)
		fmt.Println("outcome:", ce.Outcome)
	}
	// Output:
	// status: 404
	// code: BUCKET_NOT_FOUND
	// outcome: not-applied
}
