package main

// Client credentials of the ursula subcommands that talk to a node: a bearer token file
// and a CA file for https:// URLs, from flags or else from the VFS's variables.

import (
	"bytes"
	"flag"
	"fmt"
	"net/http"
	"os"

	"github.com/ursula-go/ursula/client"
)

// clientFlags are --token-file and --ca-file.
type clientFlags struct {
	tokenFile, caFile *string
}

func addClientFlags(fs *flag.FlagSet) clientFlags {
	return clientFlags{
		tokenFile: fs.String("token-file", "", "file holding the bearer token (default $URSULA_VFS_TOKEN_FILE)"),
		caFile:    fs.String("ca-file", "", "PEM CA certificates to trust for https:// (default $URSULA_VFS_CA_FILE)"),
	}
}

// newClient returns a client with the token and CA the flags or variables name.
func (f clientFlags) newClient() (*client.Client, error) {
	caFile := pickStr(*f.caFile, os.Getenv("URSULA_VFS_CA_FILE"))
	tr, err := client.NewTransportWithCA(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	opts := []client.Option{client.WithHTTPClient(&http.Client{Transport: client.NewInlineTransport(tr)})}
	if p := pickStr(*f.tokenFile, os.Getenv("URSULA_VFS_TOKEN_FILE")); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		opts = append(opts, client.WithToken(string(bytes.TrimSpace(b))))
	}
	return client.New("", opts...)
}
