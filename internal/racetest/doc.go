// Package racetest tells tests whether the race detector is on (Enabled), so a test that
// moves a lot of bytes can size its work down where the detector slows it tenfold. It is
// the one such flag of the module.
package racetest
