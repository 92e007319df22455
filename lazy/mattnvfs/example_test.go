//go:build cgo

package mattnvfs_test

import (
	"database/sql"
	"fmt"
	"log"

	"github.com/ursula-go/ursula/lazy/mattnvfs"
)

// A mattn/go-sqlite3 program reads a replicated database without downloading it: only
// the pages the query touches are fetched.
func Example() {
	if err := mattnvfs.Register(nil); err != nil {
		log.Fatal(err)
	}
	db, err := sql.Open("sqlite3", mattnvfs.DSN("http://127.0.0.1:4437/bucket/app.db", "", false))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	fmt.Println(mattnvfs.DSN("http://127.0.0.1:4437/bucket/app.db", "", true))
	// Output: file:ursula-lazy.db?vfs=ursula-lazy&mode=ro&url=http://127.0.0.1:4437/bucket/app.db&follow=1
}
