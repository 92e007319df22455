package replicator

import (
	"os"

	"github.com/ursula-go/ursula/replicator/internal/sidecar"
)

// SidecarPath is where the sidecar of the database at path lives: a file there means the
// database is replicated, and opens only once it is attached.
func SidecarPath(path string) string { return sidecar.Path(path) }

// removeLocal removes the local files of the database at path: db, -wal, -shm, sidecar.
func removeLocal(path string) {
	for _, p := range []string{path, path + "-wal", path + "-shm", sidecar.Path(path)} {
		os.Remove(p)
	}
}
