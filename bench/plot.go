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
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // the png canvas
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
	// LogYOver puts Y on a log scale when the positive Y values span more
	// than this factor (throughput: 10), so that lines of 4 GB/s are not
	// flattened under one of 400; points at Y ≤ 0 are then left out.
	// Zero: Y stays linear.
	LogYOver float64
	// XTick, when set, puts one tick at every X value of the series,
	// labelled by it (block sizes as "64KiB", ...).
	XTick func(x float64) string
	// YMin and YMax fix the Y range when YMax > YMin (ratios: 0..1).
	// Otherwise Y starts at 0 (or below the least value, on a log scale)
	// and leaves room above the data for the legend.
	YMin, YMax float64
	// LegendBottom puts the legend at the bottom right, for plots whose
	// lines run along the top.
	LegendBottom bool
	Series       []Series
}

// ErrEmptyPlot is returned by Save for a plot with no points.
var ErrEmptyPlot = errors.New("bench: plot has no points")

// The size of every plot, and the legend's inset from the data area's
// edges and padding inside its box.
const (
	plotWidth     = 8 * vg.Inch
	plotHeight    = 5 * vg.Inch
	legendInset   = vg.Length(6)
	legendPadding = vg.Length(4)
)

// Save writes p as a PNG file at path. The legend is drawn inside the
// data area, on a white box, with room kept above the data for it.
func (p LinePlot) Save(path string) error {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = p.XLabel
	pl.Y.Label.Text = p.YLabel
	pl.Add(plotter.NewGrid())
	leg := plot.NewLegend()
	leg.Top = !p.LegendBottom
	var xs []float64
	points := 0
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("bench: plot %q: series %q has %d x and %d y", p.Title, s.Name, len(s.X), len(s.Y))
		}
		for j := range s.X {
			if p.LogX && s.X[j] <= 0 {
				return fmt.Errorf("bench: plot %q: series %q: x %v on a log axis", p.Title, s.Name, s.X[j])
			}
			if s.Y[j] > 0 {
				ymin = min(ymin, s.Y[j])
			}
			ymax = max(ymax, s.Y[j])
		}
	}
	logY := p.LogYOver > 0 && ymin > 0 && ymax/ymin > p.LogYOver && p.YMax <= p.YMin
	for i, s := range p.Series {
		xys := make(plotter.XYs, 0, len(s.X))
		for j := range s.X {
			if logY && s.Y[j] <= 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: s.X[j], Y: s.Y[j]})
			xs = append(xs, s.X[j])
		}
		if len(xys) == 0 {
			continue
		}
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
		leg.Add(s.Name, line, scatter)
	}
	if points == 0 {
		return fmt.Errorf("%w: %q", ErrEmptyPlot, p.Title)
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	// Pad X so that the first and last points and their labels show.
	if p.LogX {
		pl.X.Scale = plot.LogScale{}
		pl.X.Tick.Marker = plot.LogTicks{Prec: -1}
		pl.X.Min, pl.X.Max = xs[0]/1.25, xs[len(xs)-1]*1.25
	} else if span := xs[len(xs)-1] - xs[0]; span > 0 {
		pl.X.Min, pl.X.Max = xs[0]-span/40, xs[len(xs)-1]+span/40
	}
	if p.XTick != nil {
		var ticks []plot.Tick
		for _, x := range xs {
			ticks = append(ticks, plot.Tick{Value: x, Label: p.XTick(x)})
		}
		pl.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	img, err := draw.NewFormattedCanvas(plotWidth, plotHeight, "png")
	if err != nil {
		return fmt.Errorf("bench: plot %q: %w", p.Title, err)
	}
	// A margin at the top and right, so that the title and the last tick
	// label are not cut by the image's edge.
	dc := draw.Crop(draw.New(img), 0, -vg.Points(8), 0, -vg.Points(6))
	// The share of the data area's height the legend takes, so that the
	// data stays below it.
	room := 0.0
	if !p.LegendBottom {
		room = min(0.6, float64(leg.Rectangle(dc).Size().Y+2*legendInset+2*legendPadding)/float64(pl.DataCanvas(dc).Size().Y))
	}
	switch {
	case p.YMax > p.YMin:
		pl.Y.Min, pl.Y.Max = p.YMin, p.YMax
	case logY:
		pl.Y.Scale = plot.LogScale{}
		pl.Y.Tick.Marker = logTicks125{}
		pl.Y.Label.Text += " (log scale)"
		lo := ymin / 1.5
		pl.Y.Min, pl.Y.Max = lo, lo*math.Pow(ymax*1.1/lo, 1/(1-room))
	case ymax > 0:
		pl.Y.Min, pl.Y.Max = 0, ymax*1.05/(1-room)
	}
	pl.Draw(dc)
	drawLegend(dc, pl.DataCanvas(dc), &leg)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("bench: plot %q: %w", p.Title, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: plot %q: %w", p.Title, err)
	}
	_, err = img.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: plot %q: save %s: %w", p.Title, path, err)
	}
	return nil
}

// logTicks125 marks a log axis at 1, 2 and 5 times each power of ten,
// labelled, and at the other integers times it, unlabelled: a range of
// one or two decades still reads.
type logTicks125 struct{}

func (logTicks125) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', 3, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// drawLegend draws leg inside the data area da, at its top or bottom right
// corner, on a white box.
func drawLegend(dc draw.Canvas, da draw.Canvas, leg *plot.Legend) {
	size := leg.Rectangle(da).Size()
	if size.X == 0 {
		return
	}
	// The text's drawn width can pass the width Rectangle gives it by a
	// little: one more space of room.
	size.X += leg.TextStyle.Rectangle(" ").Max.X
	r := vg.Rectangle{Max: vg.Point{X: da.Max.X - legendInset - legendPadding}}
	r.Min.X = r.Max.X - size.X
	if leg.Top {
		r.Max.Y = da.Max.Y - legendInset - legendPadding
		r.Min.Y = r.Max.Y - size.Y
	} else {
		r.Min.Y = da.Min.Y + legendInset + legendPadding
		r.Max.Y = r.Min.Y + size.Y
	}
	box := vg.Rectangle{Min: r.Min.Sub(vg.Point{X: legendPadding, Y: legendPadding}), Max: r.Max.Add(vg.Point{X: legendPadding, Y: legendPadding})}
	var path vg.Path
	path.Move(box.Min)
	path.Line(vg.Point{X: box.Max.X, Y: box.Min.Y})
	path.Line(box.Max)
	path.Line(vg.Point{X: box.Min.X, Y: box.Max.Y})
	path.Close()
	dc.SetColor(color.NRGBA{R: 255, G: 255, B: 255, A: 230})
	dc.Fill(path)
	dc.SetLineStyle(draw.LineStyle{Color: color.Gray{Y: 180}, Width: vg.Points(0.5)})
	dc.Stroke(path)
	leg.Left = false
	leg.Draw(draw.Canvas{Canvas: dc.Canvas, Rectangle: r})
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
// labelled 64KiB, 1MiB, ...), Y in GB/s (log scale where the figures span
// more than 10×). kvmesh series are solid; peers and limits (Redis, raw
// TCP, memcpy, fio) are dashed.
func ThroughputPlot(title string, series ...Series) LinePlot {
	return LinePlot{Title: title, XLabel: "block size", YLabel: "GB/s", LogX: true, LogYOver: 10, XTick: formatBytes, Series: series}
}

// vsTitle is a plot's title: what, then "vs" and the names of the
// reference series (dashed) that have points, so that it names only the
// peers and limits that ran.
func vsTitle(what string, series []Series) string {
	var peers []string
	for _, s := range series {
		if s.Dashed && len(s.X) > 0 && !slices.Contains(peers, s.Name) {
			peers = append(peers, s.Name)
		}
	}
	if len(peers) == 0 {
		return what
	}
	return what + " vs " + strings.Join(peers, ", ")
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
