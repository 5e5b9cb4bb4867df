package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefill/prefilltest"
)

// modelRow is one engine's speed on a model directory's checkpoint.
type modelRow struct {
	Engine  string `json:"engine"`
	Threads int    `json:"threads"`
	Prompt  int    `json:"prompt_tokens"`
	Decode  int    `json:"decode_tokens"`
	// PrefillTokS and DecodeTokS are medians over the runs; Min and Max
	// their spread.
	PrefillTokS    float64 `json:"prefill_tok_s"`
	PrefillMin     float64 `json:"prefill_tok_s_min"`
	PrefillMax     float64 `json:"prefill_tok_s_max"`
	DecodeTokS     float64 `json:"decode_tok_s"`
	DecodeMin      float64 `json:"decode_tok_s_min"`
	DecodeMax      float64 `json:"decode_tok_s_max"`
	PrefillVsTorch float64 `json:"prefill_vs_pytorch"`
	DecodeVsTorch  float64 `json:"decode_vs_pytorch"`
	Runs           int     `json:"runs"`
}

// spread returns the median, minimum and maximum of xs.
func spread(xs []float64) (med, lo, hi float64) {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

// onModelDir measures the engine on a Hugging Face model directory: the
// tokens per second of a cold prefill and of greedy decoding after it,
// beside the same checkpoint run by PyTorch's CPU forward (hfref.py, in
// float32, with as many threads as the engine) in the same run. The
// engine's weights are loaded once.
func (s *PrefillSuite) onModelDir(ctx context.Context, o PrefillOptions, res *Result, bar Bar) error {
	cfg, info, err := prefill.LoadConfigJSON(filepath.Join(o.ModelDir, "config.json"))
	if err != nil {
		return err
	}
	cfg.MaxContext = max(cfg.MaxContext, o.PromptTokens+o.DecodeTokens)
	t0 := time.Now()
	w, err := prefill.LoadCheckpoint(o.ModelDir, cfg, info.TieEmbeddings)
	if err != nil {
		return err
	}
	defer w.Release()
	tied := info.TieEmbeddings != nil && *info.TieEmbeddings
	res.Note("model %s (%s, %d layers, d=%d, %d heads, %d KV heads, vocab %d): loaded in %.1f s, %d MiB of float32 weights (the checkpoint's %s widened)",
		o.ModelDir, info.Arch, cfg.Layers, cfg.Dim, cfg.Heads, cfg.KVHeads, cfg.Vocab, time.Since(t0).Seconds(), cfg.WeightBytes(tied)>>20, info.DType)
	var backend prefill.Backend
	if o.Device != nil {
		if backend, err = prefill.NewDevice(o.Device, prefill.DeviceOptions{}); err != nil {
			return err
		}
	}
	e, err := prefill.New(nil, prefill.Options{Config: cfg, Weights: w, Backend: backend, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	defer e.Close()
	threads := runtime.GOMAXPROCS(0)
	var pre, dec []float64
	for run := range o.Runs {
		bar.Describe(fmt.Sprintf("prefill: model directory, run %d", run+1))
		prompt := randomPrompt(uint64(run)+1, o.PromptTokens, cfg.Vocab)
		g, err := e.Generate(ctx, prompt, prefill.GenerateOptions{MaxTokens: o.DecodeTokens})
		if err != nil {
			return err
		}
		pre = append(pre, float64(o.PromptTokens)/g.Prefill.Seconds())
		dec = append(dec, float64(g.CompletionTokens-1)/g.Decode.Seconds())
		bar.Add(1)
	}
	k := modelRow{Engine: "kvmesh " + e.Backend(), Threads: threads, Prompt: o.PromptTokens, Decode: o.DecodeTokens, Runs: o.Runs}
	k.PrefillTokS, k.PrefillMin, k.PrefillMax = spread(pre)
	k.DecodeTokS, k.DecodeMin, k.DecodeMax = spread(dec)
	rows := []modelRow{k}
	bar.Describe("prefill: model directory, PyTorch")
	torch, err := torchBench(ctx, o, threads)
	if err != nil {
		res.Skip("PyTorch's forward of the same checkpoint", err)
	} else {
		rows[0].PrefillVsTorch, rows[0].DecodeVsTorch = k.PrefillTokS/torch.PrefillTokS, k.DecodeTokS/torch.DecodeTokS
		rows = append(rows, torch)
		res.Checks = append(res.Checks,
			NewCheck("prefill: model directory, prefill vs PyTorch's CPU forward", "prefill_vs_pytorch", rows[0].PrefillVsTorch, ">=", 0.8, BackendKvmesh),
			NewCheck("prefill: model directory, decode vs PyTorch's CPU forward", "decode_vs_pytorch", rows[0].DecodeVsTorch, ">=", 0.8, BackendKvmesh))
	}
	bar.Add(1)
	res.AddTable("model", fmt.Sprintf("tokens per second of a cold %d-token prefill and of greedy decoding of %d tokens after it, "+
		"the engine (float32) against PyTorch's forward of the same checkpoint (float32, hfref.py), same threads, same run", o.PromptTokens, o.DecodeTokens), rows)
	return nil
}

// torchBench runs hfref.py bench on the model directory.
func torchBench(ctx context.Context, o PrefillOptions, threads int) (modelRow, error) {
	py, err := prefilltest.Python()
	if err != nil {
		return modelRow{}, err
	}
	dir, err := os.MkdirTemp("", "kvmesh-hfref-")
	if err != nil {
		return modelRow{}, err
	}
	defer os.RemoveAll(dir)
	script, err := prefilltest.Script(dir)
	if err != nil {
		return modelRow{}, err
	}
	cmd := exec.CommandContext(ctx, py, script, "bench", o.ModelDir, "--prompt", fmt.Sprint(o.PromptTokens),
		"--decode", fmt.Sprint(o.DecodeTokens), "--threads", fmt.Sprint(threads), "--runs", fmt.Sprint(o.Runs))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return modelRow{}, fmt.Errorf("bench: hfref.py bench: %w", err)
	}
	var r struct {
		PrefillTokS []float64 `json:"prefill_tok_s"`
		DecodeTokS  []float64 `json:"decode_tok_s"`
		Torch       string    `json:"torch"`
		BLAS        string    `json:"blas"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.PrefillTokS) == 0 {
		return modelRow{}, fmt.Errorf("bench: hfref.py bench printed %q: %v", out, err)
	}
	row := modelRow{Engine: "PyTorch " + r.Torch + " (" + r.BLAS + ")", Threads: threads, Prompt: o.PromptTokens, Decode: o.DecodeTokens, Runs: len(r.PrefillTokS)}
	row.PrefillTokS, row.PrefillMin, row.PrefillMax = spread(r.PrefillTokS)
	row.DecodeTokS, row.DecodeMin, row.DecodeMax = spread(r.DecodeTokS)
	return row, nil
}
