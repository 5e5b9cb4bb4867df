package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes rep as indented JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("bench: write json: %w", err)
	}
	return nil
}

// WriteTable writes rep for people: one block per suite with its tables,
// skipped peers, checks, plots and notes. Column names are the JSON field
// names, so a figure read here is found under the same name in -o json.
// Each table shows the columns a reader needs (WriteWide shows them all),
// and under it what each column it shows means, for the columns no earlier
// table of the report explained.
func WriteTable(w io.Writer, rep *Report) error { return writeTable(w, rep, false) }

// WriteWide is WriteTable with every column (-o wide).
func WriteWide(w io.Writer, rep *Report) error { return writeTable(w, rep, true) }

func writeTable(w io.Writer, rep *Report, wide bool) error {
	bw := &errWriter{w: w}
	explained := map[string]bool{}
	fmt.Fprintf(bw, "kvmesh bench  %s  %s/%s  %d CPUs  quick=%v\n", rep.Machine.GoVersion, rep.Machine.OS,
		rep.Machine.Arch, rep.Machine.CPUs, rep.Quick)
	for _, res := range rep.Results {
		fmt.Fprintf(bw, "\n== %s  (%.1fs)\n", res.Suite, res.Seconds)
		if res.Error != "" {
			fmt.Fprintf(bw, "FAILED: %s\n", res.Error)
		}
		for _, t := range res.Tables {
			fmt.Fprintf(bw, "\n%s\n", t.Title)
			shown, err := writeRows(bw, t.Rows, wide)
			if err != nil {
				return err
			}
			explainColumns(bw, shown, explained)
		}
		if len(res.Skipped) > 0 {
			fmt.Fprintln(bw, "\nskipped:")
			for _, s := range res.Skipped {
				fmt.Fprintf(bw, "  %s: %s\n", s.What, s.Reason)
			}
		}
		if len(res.Checks) > 0 {
			fmt.Fprintln(bw, "\nchecks:")
			for _, c := range res.Checks {
				verdict := "MET"
				if !c.Met {
					verdict = "NOT MET"
				}
				fmt.Fprintf(bw, "  [%s] %s: %s = %s (target %s %s) [%s]\n", verdict, c.Name, c.Figure,
					formatFloat(c.Value), c.Op, formatFloat(c.Target), c.Backend)
			}
		}
		for _, p := range res.Plots {
			fmt.Fprintf(bw, "plot: %s\n", p)
		}
		for _, n := range res.Notes {
			fmt.Fprintf(bw, "note: %s\n", n)
		}
	}
	if bw.err != nil {
		return fmt.Errorf("bench: write table: %w", bw.err)
	}
	return nil
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

type column struct {
	name  string
	index []int
	// show is the field's table tag: "" (always), "wide" (only in the
	// wide table) or "nonzero" (in the default table only when a row
	// has a value other than the zero one).
	show string
}

// columns returns the table columns of struct type t: exported fields with a
// json name, in declaration order, but for those tagged `table:"-"`, which
// only the JSON carries, and, unless wide, those tagged `table:"wide"`: a
// table people read must fit a terminal.
func columns(t reflect.Type, wide bool) []column {
	var cols []column
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		show := f.Tag.Get("table")
		if name == "-" || name == "" || show == "-" || show == "wide" && !wide {
			continue
		}
		if wide {
			show = ""
		}
		cols = append(cols, column{name: name, index: f.Index, show: show})
	}
	return cols
}

// writeRows prints a slice of structs as an aligned table and returns the
// names of the columns it showed.
func writeRows(w io.Writer, rows any, wide bool) ([]string, error) {
	v := reflect.ValueOf(rows)
	if v.Kind() != reflect.Slice {
		return nil, fmt.Errorf("bench: table rows are %T, want a slice of structs", rows)
	}
	et := v.Type().Elem()
	if et.Kind() == reflect.Pointer {
		et = et.Elem()
	}
	if et.Kind() != reflect.Struct {
		return nil, fmt.Errorf("bench: table rows are %T, want a slice of structs", rows)
	}
	if v.Len() == 0 {
		_, err := fmt.Fprintln(w, "  (no rows)")
		return nil, err
	}
	cols := columns(et, wide)
	cells := make([][]string, v.Len())
	present := make([]bool, len(cols))
	for i := range v.Len() {
		row := reflect.Indirect(v.Index(i))
		cells[i] = make([]string, len(cols))
		for j, c := range cols {
			fv := row.FieldByIndex(c.index)
			if fv.Kind() == reflect.Pointer && fv.IsNil() {
				cells[i][j] = "-"
				continue
			}
			if c.show != "nonzero" || !fv.IsZero() {
				present[j] = true
			}
			cells[i][j] = formatValue(fv)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var line []string
	for j, c := range cols {
		if present[j] {
			line = append(line, c.name)
		}
	}
	shown := slices.Clone(line)
	fmt.Fprintf(tw, "  %s\n", strings.Join(line, "\t"))
	for i := range cells {
		line = line[:0]
		for j := range cols {
			if present[j] {
				line = append(line, cells[i][j])
			}
		}
		fmt.Fprintf(tw, "  %s\n", strings.Join(line, "\t"))
	}
	return shown, tw.Flush()
}

// explainColumns writes what each of names means, for those not in
// explained yet, and adds them to it.
func explainColumns(w io.Writer, names []string, explained map[string]bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	first := true
	for _, n := range names {
		if explained[n] {
			continue
		}
		explained[n] = true
		if first {
			fmt.Fprintln(tw, "  where")
			first = false
		}
		fmt.Fprintf(tw, "    %s\t%s\n", n, ColumnHelp(n))
	}
	tw.Flush()
}

func formatValue(v reflect.Value) string {
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		return formatFloat(v.Float())
	case reflect.Bool:
		if v.Bool() {
			return "yes"
		}
		return "no"
	case reflect.Slice, reflect.Array:
		parts := make([]string, v.Len())
		for i := range v.Len() {
			parts[i] = formatValue(v.Index(i))
		}
		return strings.Join(parts, "/")
	default:
		return fmt.Sprint(v.Interface())
	}
}

// formatFloat prints figures the way people read them: whole numbers from
// 1000 up, four significant digits below.
func formatFloat(f float64) string {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return strconv.FormatFloat(f, 'g', -1, 64)
	case math.Abs(f) >= 1000:
		return strconv.FormatFloat(f, 'f', 0, 64)
	default:
		return strconv.FormatFloat(f, 'g', 4, 64)
	}
}
