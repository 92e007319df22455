// Package tlsfiles loads TLS material from PEM files: a certificate that follows its
// files (loaded again when they change or when asked, so a renewed certificate takes
// effect without a restart), CA pools, and the tls.Configs built from them for the
// client listener, the peer transport (mutual TLS) and clients.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Certificate is a certificate and key pair kept current with its files. Every handshake
// looks at the files' size and modification time and loads them again when either
// changed; a pair that does not load (say, the key written but not yet the certificate)
// leaves the previous one in use until it does.
type Certificate struct {
	certFile, keyFile string
	mu                sync.Mutex // serializes loads
	cur               atomic.Pointer[loadedCert]
}

type loadedCert struct {
	cert  *tls.Certificate
	stamp fileStamp
}

// fileStamp identifies a version of the two files.
type fileStamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

func stampOf(certFile, keyFile string) (fileStamp, error) {
	ci, err := os.Stat(certFile)
	if err != nil {
		return fileStamp{}, err
	}
	ki, err := os.Stat(keyFile)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{ci.ModTime(), ki.ModTime(), ci.Size(), ki.Size()}, nil
}

// LoadCertificate loads the pair; both files must be present and match.
func LoadCertificate(certFile, keyFile string) (*Certificate, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a TLS certificate needs both a certificate file and a key file")
	}
	c := &Certificate{certFile: certFile, keyFile: keyFile}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload loads the files again now (SIGHUP). On an error the previous pair stays in use.
func (c *Certificate) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loadLocked()
}

func (c *Certificate) loadLocked() error {
	st, err := stampOf(c.certFile, c.keyFile)
	if err != nil {
		return err
	}
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("tls certificate %s / key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&loadedCert{cert: &pair, stamp: st})
	return nil
}

// Current returns the pair, loading the files again first if they changed.
func (c *Certificate) Current() *tls.Certificate {
	cur := c.cur.Load()
	if st, err := stampOf(c.certFile, c.keyFile); err == nil && st != cur.stamp {
		c.mu.Lock()
		if c.cur.Load().stamp != st {
			c.loadLocked() // an error keeps the previous pair
		}
		c.mu.Unlock()
		cur = c.cur.Load()
	}
	return cur.cert
}

// Leaf returns the parsed leaf certificate of the current pair.
func (c *Certificate) Leaf() *x509.Certificate { return c.Current().Leaf }

// LoadCAPool reads a PEM file of one or more CA certificates.
func LoadCAPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// ServerConfig is the config of a listener that presents c.
func ServerConfig(c *Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.Current(), nil },
	}
}

// MutualServerConfig is the config of a listener that presents c and accepts only
// clients whose certificate ca signed.
func MutualServerConfig(c *Certificate, ca *x509.CertPool) *tls.Config {
	cfg := ServerConfig(c)
	cfg.ClientCAs = ca
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	return cfg
}

// ClientConfig is the config of a client that trusts ca (nil: the system roots) and, when
// c is not nil, presents c to servers that ask for a client certificate.
func ClientConfig(ca *x509.CertPool, c *Certificate) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: ca}
	if c != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.Current(), nil }
	}
	return cfg
}

// ClientConfigFromCAFile is ClientConfig(LoadCAPool(file), nil); "" trusts the system roots.
func ClientConfigFromCAFile(file string) (*tls.Config, error) {
	if file == "" {
		return &tls.Config{MinVersion: tls.VersionTLS12}, nil
	}
	pool, err := LoadCAPool(file)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	return ClientConfig(pool, nil), nil
}
