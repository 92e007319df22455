package vfs_test

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/vfs"
)

// exampleServer starts a stream server (memory engine) on loopback for an example; stop
// closes it.
func exampleServer() (baseURL string, stop func()) {
	s := testserver.StartExample(testserver.Options{ClusterID: "vfs-example"})
	return s.URL, s.Close
}

// exampleDir is a fresh directory for an example's database files.
func exampleDir() string {
	dir, err := os.MkdirTemp("", "vfs-example")
	if err != nil {
		log.Fatal(err)
	}
	return dir
}

// Open attaches a local file to a stream and returns it as a *sql.DB: every commit
// returns only after the server acknowledged it.
func ExampleOpen() {
	base, stop := exampleServer()
	defer stop()
	dir := exampleDir()
	defer os.RemoveAll(dir)

	db, err := vfs.Open(base+"/apps/notes", vfs.Options{Path: filepath.Join(dir, "notes.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)`); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO notes(body) VALUES ('first'), ('second')`); err != nil {
		log.Fatal(err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM notes`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "notes")
	// Output: 2 notes
}

// Status reports how replication of an open database goes: the stream it is attached
// to, the owner's epoch, how many commits reached the stream since the attach, and
// whether writes go through.
func ExampleStatus() {
	base, stop := exampleServer()
	defer stop()
	dir := exampleDir()
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "notes.db")

	db, err := vfs.Open(base+"/apps/notes", vfs.Options{Path: path})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)`); err != nil {
		log.Fatal(err)
	}
	st, err := vfs.Status(path)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stream:", st.URL == base+"/apps/notes")
	fmt.Println("epoch:", st.Epoch)
	fmt.Println("commits:", st.Commits)
	fmt.Println("error:", st.Error)
	// Output:
	// stream: true
	// epoch: 1
	// commits: 1
	// error: <nil>
}

// A failed commit comes back as a *vfs.Error: its Kind says what happened, its Action
// what to do. Here a second owner claims the stream, so the first one is fenced: its next
// commit is refused and it must stop writing.
func ExampleError() {
	base, stop := exampleServer()
	defer stop()
	dir := exampleDir()
	defer os.RemoveAll(dir)
	url := base + "/apps/notes"

	first, err := vfs.Open(url, vfs.Options{Path: filepath.Join(dir, "first.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer first.Close()
	if _, err := first.Exec(`CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)`); err != nil {
		log.Fatal(err)
	}
	second, err := vfs.Open(url, vfs.Options{Path: filepath.Join(dir, "second.db")})
	if err != nil {
		log.Fatal(err)
	}
	defer second.Close()

	_, err = first.Exec(`INSERT INTO notes(body) VALUES ('lost')`)
	var e *vfs.Error
	if errors.As(err, &e) {
		fmt.Println("kind:", e.Kind)
		fmt.Println("action:", e.Action)
	}
	// Output:
	// kind: fenced
	// action: stop
}
