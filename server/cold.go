package server

import (
	"errors"
	"fmt"

	"github.com/ursula-go/ursula/coldtier"
	coldstore "github.com/ursula-go/ursula/coldtier/store"
)

// ColdOptions tune the cold tier beyond the config file (tests).
type ColdOptions = coldtier.Options

// EnableCold attaches a cold store to the server: it opens the cold tier over the
// server's engine, which starts the flusher and the collector.
func (s *Server) EnableCold(store coldstore.Store, cfg coldstore.Config, opts ColdOptions) error {
	if store == nil {
		return nil
	}
	eng, ok := s.engine.(coldtier.Engine)
	if !ok {
		return fmt.Errorf("the %s engine does not support the cold tier yet; set storage.cold.backend = \"none\"", s.engine.Stats().Engine)
	}
	if opts.Logger == nil {
		opts.Logger = s.cfg.Logger
	}
	t, err := coldtier.Open(eng, store, cfg, s.cfg.ClusterID, opts)
	if err != nil {
		return err
	}
	s.cold = t
	return nil
}

// StopCold stops the flusher and the collector and waits for them.
func (s *Server) StopCold() { s.cold.Close() }

// FlushCold runs one flush pass now. With all set, every hot byte of every group is
// flushed regardless of thresholds (tests, and the admin flush).
func (s *Server) FlushCold(all bool) error {
	if s.cold == nil {
		return errors.New("no cold store configured")
	}
	return s.cold.Flush(all)
}

// ColdStats reports the cold tier's counters (backend "none" without one).
func (s *Server) ColdStats() coldtier.Stats { return s.cold.Stats() }
