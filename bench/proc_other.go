//go:build !linux

package bench

import (
	"errors"
	"syscall"
	"time"
)

func setDeathSignal(*syscall.SysProcAttr) {}

// checkDirectIO leaves the verdict to fio where O_DIRECT is not Linux's.
func checkDirectIO(string) error { return nil }

// processCPU is not measured off Linux: CPU-time ratios read as 0.
func processCPU() time.Duration { return 0 }

// pidCPU is not measured off Linux.
func pidCPU(int) time.Duration { return 0 }

// loadAverage is not read off Linux.
func loadAverage() (float64, error) { return 0, errors.New("bench: no load average off Linux") }
