package bench

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Series is one line of a plot: Y as a function of X, in X order.
type Series struct {
	Name   string
	X, Y   []float64
	Dashed bool // a reference (peer, limit, ideal) rather than a measurement
}

// LinePlot is a line chart written as PNG.
type LinePlot struct {
	Title, XLabel, YLabel string
	// LogX puts X on a log scale; every X must then be positive.
	LogX bool
	// XTick, when set, puts one tick at every X value of the series,
	// labelled by it (block sizes as "64KiB", ...).
	XTick func(x float64) string
	// YMin and YMax fix the Y range when YMax > YMin (ratios: 0..1).
	// Otherwise Y starts at 0 and leaves room above the data for the legend.
	YMin, YMax float64
	// LegendBottom puts the legend at the bottom right, for plots whose
	// lines run along the top.
	LegendBottom bool
	Series       []Series
}

// ErrEmptyPlot is returned by Save for a plot with no points.
var ErrEmptyPlot = errors.New("bench: plot has no points")

// Save writes p as a PNG file at path.
func (p LinePlot) Save(path string) error {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = p.XLabel
	pl.Y.Label.Text = p.YLabel
	pl.Legend.Top = !p.LegendBottom
	pl.Add(plotter.NewGrid())
	var xs []float64
	points, named := 0, 0
	ymax := math.Inf(-1)
	for i, s := range p.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("bench: plot %q: series %q has %d x and %d y", p.Title, s.Name, len(s.X), len(s.Y))
		}
		if len(s.X) == 0 {
			continue
		}
		xys := make(plotter.XYs, len(s.X))
		for j := range s.X {
			if p.LogX && s.X[j] <= 0 {
				return fmt.Errorf("bench: plot %q: series %q: x %v on a log axis", p.Title, s.Name, s.X[j])
			}
			xys[j] = plotter.XY{X: s.X[j], Y: s.Y[j]}
			xs = append(xs, s.X[j])
			ymax = max(ymax, s.Y[j])
		}
		named++
		points += len(xys)
		line, scatter, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("bench: plot %q: %w", p.Title, err)
		}
		c := plotutil.Color(i)
		if s.Dashed {
			c = darken(c)
			line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		line.Color = c
		line.Width = vg.Points(1.5)
		scatter.Color = c
		scatter.Shape = plotutil.Shape(i)
		pl.Add(line, scatter)
		pl.Legend.Add(s.Name, line, scatter)
	}
	if points == 0 {
		return fmt.Errorf("%w: %q", ErrEmptyPlot, p.Title)
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	if p.LogX {
		pl.X.Scale = plot.LogScale{}
		pl.X.Tick.Marker = plot.LogTicks{Prec: -1}
		// Pad so that the first and last points and their labels show.
		pl.X.Min, pl.X.Max = xs[0]/1.25, xs[len(xs)-1]*1.25
	}
	if p.XTick != nil {
		var ticks []plot.Tick
		for _, x := range xs {
			ticks = append(ticks, plot.Tick{Value: x, Label: p.XTick(x)})
		}
		pl.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	switch {
	case p.YMax > p.YMin:
		pl.Y.Min, pl.Y.Max = p.YMin, p.YMax
	case ymax > 0:
		// Every series' legend line takes about 6% of the height.
		pl.Y.Min, pl.Y.Max = 0, ymax*(1.05+0.065*float64(named))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("bench: plot %q: %w", p.Title, err)
	}
	if err := pl.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("bench: plot %q: save %s: %w", p.Title, path, err)
	}
	return nil
}

func darken(c color.Color) color.Color {
	r, g, b, a := c.RGBA()
	return color.RGBA64{R: uint16(r * 3 / 4), G: uint16(g * 3 / 4), B: uint16(b * 3 / 4), A: uint16(a)}
}

// GroupSeries makes one series per name of rows, in the order names first
// appear: point names a row's series (skip false) and whether it is a
// reference (dashed), and its X and Y.
func GroupSeries[R any](rows []R, point func(r R) (name string, dashed, skip bool, x, y float64)) []Series {
	var out []Series
	index := map[string]int{}
	for _, r := range rows {
		name, dashed, skip, x, y := point(r)
		if skip {
			continue
		}
		i, ok := index[name]
		if !ok {
			i = len(out)
			index[name] = i
			out = append(out, Series{Name: name, Dashed: dashed})
		}
		out[i].X, out[i].Y = append(out[i].X, x), append(out[i].Y, y)
	}
	return out
}

// ThroughputPlot is "throughput vs block size": X in bytes (log scale,
// labelled 64KiB, 1MiB, ...), Y in GB/s. kvmesh series are solid; peers
// and limits (Redis, raw TCP, memcpy, fio) are dashed.
func ThroughputPlot(title string, series ...Series) LinePlot {
	return LinePlot{Title: title, XLabel: "block size", YLabel: "GB/s", LogX: true, XTick: formatBytes, Series: series}
}

// HitRatioPlot is "hit ratio vs capacity" per routing policy: X is pooled
// capacity as a fraction of the trace's distinct full blocks (log scale),
// Y the block hit ratio; the trace's ideal is drawn as a dashed line.
func HitRatioPlot(title string, ideal float64, series ...Series) LinePlot {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, x := range s.X {
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	if hi >= lo {
		series = append(series, Series{Name: fmt.Sprintf("ideal (%.3f)", ideal), X: []float64{lo, hi}, Y: []float64{ideal, ideal}, Dashed: true})
	}
	return LinePlot{Title: title, XLabel: "pooled capacity / distinct blocks of the trace", YLabel: "block hit ratio",
		LogX: true, XTick: func(x float64) string { return strconv.FormatFloat(x, 'g', 3, 64) },
		YMin: 0, YMax: max(1.1*ideal, 0.05), LegendBottom: true, Series: series}
}

// TTFTPlot is "TTFT vs cached fraction": X the fraction of the prompt found
// in the cache (0..1), Y the time to first token in milliseconds.
func TTFTPlot(title string, series ...Series) LinePlot {
	return LinePlot{Title: title, XLabel: "cached fraction of the prompt", YLabel: "TTFT (ms)", Series: series}
}

// SavePlot writes p as NAME.png into env.OutDir and lists it in res. With
// no OutDir it does nothing.
func SavePlot(env *Env, res *Result, name string, p LinePlot) error {
	if env.OutDir == "" {
		return nil
	}
	path := filepath.Join(env.OutDir, name+".png")
	if err := p.Save(path); err != nil {
		return err
	}
	res.Plots = append(res.Plots, path)
	return nil
}

// formatBytes prints a size with binary units: 65536 → "64KiB".
func formatBytes(x float64) string {
	n := int64(x)
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	default:
		return fmt.Sprintf("%dB", n)
	}
}
