package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// FioOptions configures the fio peer: the disk's own limits, measured with
// direct I/O so the page cache does not flatter them.
type FioOptions struct {
	// Binary is fio. Default "fio", looked up in PATH.
	Binary string
	// Dir is a directory on the device to measure. Required.
	Dir string
	// FileBytes is the size of the test file. Default 1 GiB.
	FileBytes int64
	// Runtime is how long each job runs. Default 5s.
	Runtime time.Duration
	// IOEngine is fio's ioengine. Default "libaio".
	IOEngine string
	// IODepth is the I/Os in flight per job. Default 16: a limit, not a
	// single thread's figure.
	IODepth int
	// NumJobs is the number of parallel jobs. Default 1.
	NumJobs int
}

// EnsureDefaults fills zero fields with their defaults.
func (o *FioOptions) EnsureDefaults() {
	if o.Binary == "" {
		o.Binary = "fio"
	}
	if o.FileBytes == 0 {
		o.FileBytes = 1 << 30
	}
	if o.Runtime == 0 {
		o.Runtime = 5 * time.Second
	}
	if o.IOEngine == "" {
		o.IOEngine = "libaio"
	}
	if o.IODepth == 0 {
		o.IODepth = 16
	}
	if o.NumJobs == 0 {
		o.NumJobs = 1
	}
}

// Validate names the first field that is out of range.
func (o *FioOptions) Validate() error {
	switch {
	case o.Dir == "":
		return fmt.Errorf("bench: fio: dir is required")
	case o.FileBytes < 1<<20:
		return fmt.Errorf("bench: fio: file_bytes %d must be at least 1 MiB", o.FileBytes)
	case o.Runtime < time.Millisecond:
		return fmt.Errorf("bench: fio: runtime %v must be at least 1ms", o.Runtime)
	case o.IODepth < 1 || o.IODepth > 4096:
		return fmt.Errorf("bench: fio: iodepth %d is outside 1..4096", o.IODepth)
	case o.NumJobs < 1 || o.NumJobs > 256:
		return fmt.Errorf("bench: fio: numjobs %d is outside 1..256", o.NumJobs)
	case strings.ContainsAny(o.IOEngine, " \t\n="):
		return fmt.Errorf("bench: fio: ioengine %q is not a name", o.IOEngine)
	}
	return nil
}

// FioJob is one fio workload.
type FioJob struct {
	Name       string // names the row: "seq_write", "rand_read"
	RW         string // fio's rw: "write", "randread", ...
	BlockBytes int
	// Once runs the job over the file once (FileBytes) instead of for
	// Runtime.
	Once bool
	// Args are more fio arguments, e.g. "--end_fsync=1".
	Args []string
}

// The two jobs DESIGN.md's NVMe targets compare with.
var (
	FioSeqWrite = FioJob{Name: "seq_write", RW: "write", BlockBytes: 1 << 20}
	FioRandRead = FioJob{Name: "rand_read", RW: "randread", BlockBytes: 256 << 10}
)

// FioResult is what fio measured for one job. GB/s are 10^9 bytes per second.
type FioResult struct {
	Job        string  `json:"job"`
	RW         string  `json:"rw"`
	BlockBytes int     `json:"block_bytes"`
	IOEngine   string  `json:"ioengine" table:"wide"`
	IODepth    int     `json:"iodepth" table:"wide"`
	NumJobs    int     `json:"numjobs"`
	GBps       float64 `json:"gbps"`
	IOPS       float64 `json:"iops"`
	P50MS      float64 `json:"clat_p50_ms" table:"wide"`
	P99MS      float64 `json:"clat_p99_ms"`
}

// Fio runs job with direct I/O on a file in o.Dir (kept between jobs, so a
// read job reuses the file a write job laid out) and parses fio's JSON
// output. Without fio, or on a file system without direct I/O, the error
// wraps ErrMissing.
func Fio(ctx context.Context, o FioOptions, job FioJob) (FioResult, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return FioResult{}, err
	}
	if job.BlockBytes < 512 || job.RW == "" {
		return FioResult{}, fmt.Errorf("bench: fio: job %q: rw %q, block %d bytes", job.Name, job.RW, job.BlockBytes)
	}
	bin, err := exec.LookPath(o.Binary)
	if err != nil {
		return FioResult{}, fmt.Errorf("%w: fio: %s not found (apt-get install fio): %w", ErrMissing, o.Binary, err)
	}
	if err := checkDirectIO(o.Dir); err != nil {
		return FioResult{}, err
	}
	args := []string{
		"--name=kvmesh-" + job.Name,
		"--filename=" + filepath.Join(o.Dir, "kvmesh-bench-fio.dat"),
		"--rw=" + job.RW,
		"--bs=" + strconv.Itoa(job.BlockBytes),
		"--size=" + strconv.FormatInt(o.FileBytes, 10),
		"--direct=1",
		"--ioengine=" + o.IOEngine,
		"--iodepth=" + strconv.Itoa(o.IODepth),
		"--numjobs=" + strconv.Itoa(o.NumJobs),
		"--group_reporting",
		"--output-format=json",
	}
	if !job.Once {
		args = append(args, "--time_based", "--runtime="+strconv.FormatInt(o.Runtime.Milliseconds(), 10)+"ms")
	}
	args = append(args, job.Args...)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return FioResult{}, ctx.Err()
		}
		return FioResult{}, fmt.Errorf("bench: fio %s: %w: %s", job.Name, err, firstLines(stderr.String()+stdout.String(), 3))
	}
	r, err := parseFio(stdout.Bytes(), job)
	if err != nil {
		return FioResult{}, err
	}
	r.IOEngine, r.IODepth, r.NumJobs = o.IOEngine, o.IODepth, o.NumJobs
	return r, nil
}

// RemoveFioFile removes the test file Fio leaves in dir.
func RemoveFioFile(dir string) error {
	err := os.Remove(filepath.Join(dir, "kvmesh-bench-fio.dat"))
	if os.IsNotExist(err) {
		return nil
	}
	return err
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[:min(n, len(lines))], " | ")
}

type fioOutput struct {
	Jobs []struct {
		JobName string  `json:"jobname"`
		Error   int     `json:"error"`
		Read    fioStat `json:"read"`
		Write   fioStat `json:"write"`
	} `json:"jobs"`
}

type fioStat struct {
	BWBytes float64 `json:"bw_bytes"`
	IOPS    float64 `json:"iops"`
	Clat    struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"clat_ns"`
}

// parseFio reads fio's --output-format=json output; fio may print notices
// before the JSON object, which are skipped.
func parseFio(out []byte, job FioJob) (FioResult, error) {
	i := bytes.IndexByte(out, '{')
	if i < 0 {
		return FioResult{}, fmt.Errorf("bench: fio %s: no JSON in the output: %s", job.Name, firstLines(string(out), 3))
	}
	var fo fioOutput
	if err := json.Unmarshal(out[i:], &fo); err != nil {
		return FioResult{}, fmt.Errorf("bench: fio %s: parse output: %w", job.Name, err)
	}
	if len(fo.Jobs) == 0 {
		return FioResult{}, fmt.Errorf("bench: fio %s: output has no jobs", job.Name)
	}
	j := fo.Jobs[0]
	if j.Error != 0 {
		return FioResult{}, fmt.Errorf("bench: fio %s: job failed with error %d", job.Name, j.Error)
	}
	st := j.Read
	if strings.Contains(job.RW, "write") {
		st = j.Write
	}
	if st.BWBytes <= 0 {
		return FioResult{}, fmt.Errorf("bench: fio %s: the job moved no bytes", job.Name)
	}
	return FioResult{Job: job.Name, RW: job.RW, BlockBytes: job.BlockBytes, GBps: st.BWBytes / 1e9, IOPS: st.IOPS,
		P50MS: st.Clat.Percentile["50.000000"] / 1e6, P99MS: st.Clat.Percentile["99.000000"] / 1e6}, nil
}
