// GPU health for gpupin's health tests: NVML's event sets (XIDs, double-bit ECC errors),
// ECC counters, row remapping, retired pages pending and the driver's GPU recovery action
// (the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION). go-nvml's mock models none of
// them, so this bridge answers them from a file the test writes, read again at every call
// (a test fires an event by appending it, and changes a counter by rewriting the file):
//
//	GPUPIN_MOCK_NVML_HEALTH (else mock-nvml-health.json beside the library):
//	{"events": [{"index": 2, "type": "xid", "xid": 79}, {"index": 1, "type": "dbe"},
//	            {"index": 0, "type": "xid", "xid": 48, "gi": 2}],
//	 "gpus": [{"index": 3, "remap_pending": true, "remap_failure": false,
//	           "dbe_volatile": 2, "retired_pending": false, "lost": false,
//	           "throttle": 64, "recovery_action": 1}]}
//
// An event's "gi" (and "ci") attribute it to a MIG GPU instance (and compute instance), as
// the driver does for an XID it can; without them the event is the whole GPU's. The
// recovery action is nvml.h's nvmlDeviceGpuRecoveryAction_t (0 none, 1 GPU reset, 2 node
// reboot, ...); "recovery_action": -1 answers NOT_SUPPORTED, as a driver older than the
// field does.
//
// Each event set delivers the file's events in order, each once, to the GPUs registered
// on it for that event's type (nvmlEventSetWait_v2 waits up to its timeout for the next
// one, then answers TIMEOUT). A GPU the file does not list has no errors and nothing
// pending. Without the file: no events, no errors.
package main

/*
#include <stdlib.h>

typedef struct {
	unsigned int fieldId;
	unsigned int scopeId;
	long long timestamp;
	long long latencyUsec;
	int valueType;
	int nvmlReturn;
	unsigned long long value;
} mockFieldValue;

typedef struct {
	void *device;
	unsigned long long eventType;
	unsigned long long eventData;
	unsigned int gpuInstanceId;
	unsigned int computeInstanceId;
} mockEventData;
*/
import "C"

import (
	"encoding/json"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML's event type bits (nvml.h's nvmlEventType*).
const (
	eventDoubleBitEcc uint64 = 0x2
	eventXid          uint64 = 0x8
	eventsSupported          = eventDoubleBitEcc | eventXid
)

type healthFile struct {
	Events []struct {
		Index int    `json:"index"`
		Type  string `json:"type"`
		Xid   uint64 `json:"xid"`
		// Gi and Ci: the MIG GPU and compute instance it is attributable to, if any.
		Gi *uint32 `json:"gi"`
		Ci *uint32 `json:"ci"`
	} `json:"events"`
	Gpus []struct {
		Index          int    `json:"index"`
		RemapPending   bool   `json:"remap_pending"`
		RemapFailure   bool   `json:"remap_failure"`
		DbeVolatile    uint64 `json:"dbe_volatile"`
		RetiredPending bool   `json:"retired_pending"`
		// Lost: fallen off the bus; its health queries answer GPU_IS_LOST.
		Lost bool `json:"lost"`
		// Throttle: NVML's clock throttle reason bits (0x40: hardware thermal slowdown).
		Throttle uint64 `json:"throttle"`
		// RecoveryAction: the driver's GPU recovery action; -1: the field is not supported.
		RecoveryAction int `json:"recovery_action"`
	} `json:"gpus"`
}

// readHealth reads the file now; an empty one where there is none or it does not parse
// (a test may be halfway through rewriting it: the next call reads it whole).
func readHealth() healthFile {
	path := os.Getenv("GPUPIN_MOCK_NVML_HEALTH")
	if path == "" {
		path = besideLibrary("mock-nvml-health.json")
	}
	var f healthFile
	if path == "" {
		return f
	}
	text, err := os.ReadFile(path)
	if err == nil {
		_ = json.Unmarshal(text, &f)
	}
	return f
}

// gpuIndex is the position of device handle h, or -1.
func gpuIndex(h unsafe.Pointer) int {
	mu.Lock()
	defer mu.Unlock()
	for i, p := range handles {
		if p == h {
			return i
		}
	}
	return -1
}

// eventSet is one nvmlEventSet_t: which GPUs want which events, and how many of the
// file's events it has looked at.
type eventSet struct {
	registered map[int]uint64
	next       int
}

var (
	setsMu sync.Mutex
	sets   = map[unsafe.Pointer]*eventSet{}
)

//export nvmlDeviceGetSupportedEventTypes
func nvmlDeviceGetSupportedEventTypes(h unsafe.Pointer, types *C.ulonglong) C.int {
	if gpuIndex(h) < 0 || types == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*types = C.ulonglong(eventsSupported)
	return ret(nvml.SUCCESS)
}

//export nvmlEventSetCreate
func nvmlEventSetCreate(set *unsafe.Pointer) C.int {
	if set == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	setsMu.Lock()
	defer setsMu.Unlock()
	h := C.malloc(1)
	sets[h] = &eventSet{registered: map[int]uint64{}}
	*set = h
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceRegisterEvents
func nvmlDeviceRegisterEvents(h unsafe.Pointer, types C.ulonglong, set unsafe.Pointer) C.int {
	i := gpuIndex(h)
	if i < 0 {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if uint64(types)&^eventsSupported != 0 {
		return ret(nvml.ERROR_NOT_SUPPORTED)
	}
	setsMu.Lock()
	defer setsMu.Unlock()
	s, ok := sets[set]
	if !ok {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	s.registered[i] |= uint64(types)
	return ret(nvml.SUCCESS)
}

// noInstance is the gpuInstanceId and computeInstanceId of an event no instance has.
const noInstance uint32 = 0xFFFFFFFF

// firedEvent is one event an event set delivers.
type firedEvent struct {
	index  int
	kind   uint64
	data   uint64
	gi, ci uint32
}

// nextEvent is the set's next event from the file that a registered GPU wants, if any.
func nextEvent(s *eventSet) (firedEvent, bool) {
	f := readHealth()
	for s.next < len(f.Events) {
		e := f.Events[s.next]
		s.next++
		fired := firedEvent{index: e.Index, gi: noInstance, ci: noInstance}
		switch e.Type {
		case "xid":
			fired.kind, fired.data = eventXid, e.Xid
		case "dbe":
			fired.kind = eventDoubleBitEcc
		default:
			continue
		}
		if e.Gi != nil {
			fired.gi = *e.Gi
		}
		if e.Ci != nil {
			fired.ci = *e.Ci
		}
		if s.registered[e.Index]&fired.kind != 0 {
			return fired, true
		}
	}
	return firedEvent{}, false
}

//export nvmlEventSetWait_v2
func nvmlEventSetWait_v2(set unsafe.Pointer, data *C.mockEventData, timeoutMs C.uint) C.int {
	if data == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		setsMu.Lock()
		s, ok := sets[set]
		if !ok {
			setsMu.Unlock()
			return ret(nvml.ERROR_INVALID_ARGUMENT)
		}
		fired, found := nextEvent(s)
		setsMu.Unlock()
		if found {
			mu.Lock()
			data.device = handles[fired.index]
			mu.Unlock()
			data.eventType = C.ulonglong(fired.kind)
			data.eventData = C.ulonglong(fired.data)
			data.gpuInstanceId = C.uint(fired.gi)
			data.computeInstanceId = C.uint(fired.ci)
			return ret(nvml.SUCCESS)
		}
		if !time.Now().Before(deadline) {
			return ret(nvml.ERROR_TIMEOUT)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

//export nvmlEventSetFree
func nvmlEventSetFree(set unsafe.Pointer) C.int {
	setsMu.Lock()
	defer setsMu.Unlock()
	if _, ok := sets[set]; !ok {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	delete(sets, set)
	C.free(set)
	return ret(nvml.SUCCESS)
}

// gpuHealth is GPU i's line of the file (zero where it has none).
func gpuHealth(i int) (remapPending, remapFailure bool, dbe uint64, retired bool) {
	for _, g := range readHealth().Gpus {
		if g.Index == i {
			return g.RemapPending, g.RemapFailure, g.DbeVolatile, g.RetiredPending
		}
	}
	return false, false, 0, false
}

// gpuLost is whether GPU i has fallen off the bus in the file.
func gpuLost(i int) bool {
	for _, g := range readHealth().Gpus {
		if g.Index == i {
			return g.Lost
		}
	}
	return false
}

//export nvmlDeviceGetRemappedRows
func nvmlDeviceGetRemappedRows(h unsafe.Pointer, corr, unc, pending, failure *C.uint) C.int {
	i := gpuIndex(h)
	if i < 0 || corr == nil || unc == nil || pending == nil || failure == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	if gpuLost(i) {
		return ret(nvml.ERROR_GPU_IS_LOST)
	}
	p, f, _, _ := gpuHealth(i)
	*corr, *unc, *pending, *failure = 0, 0, 0, 0
	if p {
		*unc, *pending = 1, 1
	}
	if f {
		*failure = 1
	}
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetTotalEccErrors
func nvmlDeviceGetTotalEccErrors(h unsafe.Pointer, errorType C.int, counterType C.int, count *C.ulonglong) C.int {
	i := gpuIndex(h)
	if i < 0 || count == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	_, _, dbe, _ := gpuHealth(i)
	// Uncorrected (1) errors are the double-bit ones; corrected (0) are none here. The
	// volatile (0) and aggregate (1) counters say the same.
	switch errorType {
	case 1:
		*count = C.ulonglong(dbe)
	default:
		*count = 0
	}
	_ = counterType
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetRetiredPagesPendingStatus
func nvmlDeviceGetRetiredPagesPendingStatus(h unsafe.Pointer, pending *C.int) C.int {
	i := gpuIndex(h)
	if i < 0 || pending == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	_, _, _, retired := gpuHealth(i)
	*pending = 0
	if retired {
		*pending = 1
	}
	return ret(nvml.SUCCESS)
}

//export nvmlDeviceGetCurrentClocksThrottleReasons
func nvmlDeviceGetCurrentClocksThrottleReasons(h unsafe.Pointer, reasons *C.ulonglong) C.int {
	i := gpuIndex(h)
	if i < 0 || reasons == nil {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	*reasons = 0
	for _, g := range readHealth().Gpus {
		if g.Index == i {
			*reasons = C.ulonglong(g.Throttle)
		}
	}
	return ret(nvml.SUCCESS)
}


// fieldRecoveryAction is nvml.h's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.
const fieldRecoveryAction = 230

//export nvmlDeviceGetFieldValues
func nvmlDeviceGetFieldValues(h unsafe.Pointer, count C.int, values *C.mockFieldValue) C.int {
	i := gpuIndex(h)
	if i < 0 || count < 0 || (count > 0 && values == nil) {
		return ret(nvml.ERROR_INVALID_ARGUMENT)
	}
	action := 0
	for _, g := range readHealth().Gpus {
		if g.Index == i {
			action = g.RecoveryAction
		}
	}
	fields := unsafe.Slice(values, int(count))
	for k := range fields {
		f := &fields[k]
		f.timestamp = C.longlong(time.Now().UnixMicro())
		f.latencyUsec = 0
		f.value = 0
		switch {
		case f.fieldId != fieldRecoveryAction || action < 0:
			f.nvmlReturn = ret(nvml.ERROR_NOT_SUPPORTED)
		case gpuLost(i):
			f.nvmlReturn = ret(nvml.ERROR_GPU_IS_LOST)
		default:
			// NVML_VALUE_TYPE_UNSIGNED_INT: the low four bytes of the union.
			f.valueType = 1
			f.nvmlReturn = ret(nvml.SUCCESS)
			f.value = C.ulonglong(uint32(action))
		}
	}
	return ret(nvml.SUCCESS)
}
