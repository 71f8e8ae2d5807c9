// GPU memory limits per cgroup (nvmlDeviceSetMemoryLimits_v1, NVML API 13), for gpupin's
// test of shared GPUs: go-nvml's mock has no such feature, so this bridge answers it as a
// driver with it would, and records what was set. With GPUPIN_MOCK_NVML_LIMITS (else
// mock-nvml-limits.log beside the library) naming a file, every call appends one JSON
// line to it:
//
//	{"index": 0, "cgroup": "/sys/fs/cgroup/gpupin-exec-42", "soft": 21474836480, "hard": 21474836480}
//
// Without it the driver lacks the feature: NOT_SUPPORTED, as a driver before R615 says.
package main

/*
typedef struct {
	const char *nameSpace;
	unsigned long long softLimit;
	unsigned long long hardLimit;
} mockSetMemoryLimits;
*/
import "C"

import (
	"encoding/json"
	"os"
	"strings"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func limitsLog() string {
	if path := os.Getenv("GPUPIN_MOCK_NVML_LIMITS"); path != "" {
		return path
	}
	// Beside a library that may sit on a read-only overlay: a file naming the log.
	if named := besideLibrary("mock-nvml-limits.path"); named != "" {
		if text, err := os.ReadFile(named); err == nil {
			return strings.TrimSpace(string(text))
		}
	}
	return ""
}

//export nvmlDeviceSetMemoryLimits_v1
func nvmlDeviceSetMemoryLimits_v1(h unsafe.Pointer, limits *C.mockSetMemoryLimits) C.int {
	i := gpuIndex(h)
	if i < 0 || limits == nil || limits.nameSpace == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	path := limitsLog()
	if path == "" {
		return ret(nvml.ERROR_NOT_SUPPORTED)
	}
	if limits.softLimit > limits.hardLimit {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	line, _ := json.Marshal(map[string]any{
		"index":  i,
		"cgroup": C.GoString(limits.nameSpace),
		"soft":   uint64(limits.softLimit),
		"hard":   uint64(limits.hardLimit),
	})
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return ret(nvml.ERROR_UNKNOWN)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		return ret(nvml.ERROR_UNKNOWN)
	}
	return ret(nvml.SUCCESS)
}
