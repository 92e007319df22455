//go:build !race

package racetest

// Enabled reports that this binary was built with -race.
const Enabled = false
