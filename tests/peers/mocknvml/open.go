// Which processes have NVML open, for gpupin's reset test: the driver resets no GPU that a
// process has open (nvidia-smi says "In use by another client"), NVML's clients included.
// With GPUPIN_MOCK_NVML_OPEN naming a directory, a process that initialises the library
// leaves a file named by its pid there until its last nvmlShutdown; the test's stand-in
// for nvidia-smi --gpu-reset refuses while a live process has one.
package main

import (
	"os"
	"path/filepath"
	"strconv"
)

// markOpen records (open) or removes (!open) this process's mark, where asked to.
func markOpen(open bool) {
	dir := os.Getenv("GPUPIN_MOCK_NVML_OPEN")
	if dir == "" {
		return
	}
	mark := filepath.Join(dir, strconv.Itoa(os.Getpid()))
	if open {
		_ = os.WriteFile(mark, nil, 0o644)
	} else {
		_ = os.Remove(mark)
	}
}
