package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// envName is the environment variable that sets a flag: KVMESH_ and the flag
// name in upper case with dashes as underscores (--data-dir: KVMESH_DATA_DIR).
func envName(flag string) string {
	return "KVMESH_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// layer sets every flag of fs that was not given on the command line from
// the environment, else from the config file's values (keys are flag names),
// so the order of precedence is: flag, KVMESH_* variable, config file,
// default. The config flag itself and help are skipped. It returns where
// each flag it set came from (see source), for error messages.
func layer(fs *pflag.FlagSet, lookupEnv func(string) (string, bool), config map[string]string, configPath string) (map[string]string, error) {
	keys := make([]string, 0, len(config))
	for k := range config {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first unknown key in order, whatever the map's order
	for _, k := range keys {
		if f := fs.Lookup(k); f == nil || k == "config" || k == "help" {
			return nil, fmt.Errorf("config file %s: unknown key %q (the keys are the long flag names of the command)", configPath, k)
		}
	}
	from := map[string]string{}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "config" || f.Name == "help" {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
			}
			from[f.Name] = envName(f.Name)
			return
		}
		if v, ok := config[f.Name]; ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("config file %s: %s: %q: %w", configPath, f.Name, v, e)
			}
			from[f.Name] = fmt.Sprintf("config file %s: %s", configPath, f.Name)
		}
	})
	return from, err
}

// source names where flag name's value came from, given layer's answer:
// the config key or environment variable that set it, else the flag.
func source(from map[string]string, name string) string {
	if s, ok := from[name]; ok {
		return s
	}
	return "--" + name
}

// readConfig reads a YAML config file of flag names and values (see
// parseConfig); no path, no values.
func readConfig(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	return parseConfig(b, path)
}

// maxConfigBytes bounds a config file: a few dozen flags take a few KiB.
const maxConfigBytes = 1 << 20

// parseConfig decodes a config file: a YAML mapping of flag names to
// values. A value is a scalar, or for a list flag (--join) a sequence of
// scalars, which becomes their comma-separated values; null is the empty
// string. Anything else is refused with one line that names the key and its
// line: a nested mapping, a sequence of sequences, a key given twice, a key
// that is not a name. It never panics, whatever data holds.
func parseConfig(data []byte, path string) (map[string]string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("config file %s: %s", path, fmt.Sprintf(format, args...))
	}
	if len(data) > maxConfigBytes {
		return nil, bad("%d bytes; a config file is at most %d", len(data), maxConfigBytes)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, bad("%s", oneLine(err.Error()))
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, nil // empty, or comments only
	}
	root := resolve(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, bad("line %d: want a mapping of flag names to values (like \"dram: 8GiB\"), not a %s", root.Line, kindName(root))
	}
	out := make(map[string]string, len(root.Content)/2)
	lines := make(map[string]int, len(root.Content)/2)
	for i := 0; i+1 < len(root.Content); i += 2 {
		kn, vn := resolve(root.Content[i]), resolve(root.Content[i+1])
		if kn.Kind != yaml.ScalarNode || kn.Tag == "!!null" || kn.Value == "" || !utf8.ValidString(kn.Value) || strings.ContainsAny(kn.Value, "\n\r") {
			return nil, bad("line %d: a key must be a flag name, not a %s", kn.Line, kindName(kn))
		}
		key := kn.Value
		if prev, ok := lines[key]; ok {
			return nil, bad("%s: given twice (lines %d and %d)", quoteKey(key), prev, kn.Line)
		}
		lines[key] = kn.Line
		v, err := configValue(vn)
		if err != nil {
			return nil, bad("%s: line %d: %v", quoteKey(key), vn.Line, err)
		}
		out[key] = v
	}
	return out, nil
}

// configValue returns the flag value a YAML value node stands for.
func configValue(n *yaml.Node) (string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "", nil
		}
		return scalarValue(n)
	case yaml.SequenceNode:
		parts := make([]string, len(n.Content))
		for i, c := range n.Content {
			c = resolve(c)
			if c.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("item %d is a %s; want a list of values", i+1, kindName(c))
			}
			v, err := scalarValue(c)
			if err != nil {
				return "", fmt.Errorf("item %d: %w", i+1, err)
			}
			parts[i] = v
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("want a value or a list of values, not a %s", kindName(n))
}

func scalarValue(n *yaml.Node) (string, error) {
	if !utf8.ValidString(n.Value) || strings.ContainsAny(n.Value, "\n\r") {
		return "", errors.New("want a one-line value")
	}
	return n.Value, nil
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 8; i++ {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return "value"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}

// quoteKey quotes a key for an error message, shortened when long.
func quoteKey(k string) string {
	if len(k) > 64 {
		k = k[:64] + "..."
	}
	return strconv.Quote(k)
}

// oneLine joins the lines of a multi-line message.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// sizeValue is a flag holding a byte count written as 64MiB, 1GiB, 512KB,
// 1.5GiB or a plain number of bytes. KiB, MiB, GiB, TiB are powers of 1024;
// KB, MB, GB, TB powers of 1000.
type sizeValue struct{ p *int64 }

func newSize(p *int64, def int64) *sizeValue {
	*p = def
	return &sizeValue{p}
}

func (s *sizeValue) String() string { return formatSize(*s.p) }
func (s *sizeValue) Type() string   { return "size" }

func (s *sizeValue) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s.p = n
	return nil
}

// optionalSize is a size flag whose default is another value's (it shows
// no default of its own; its usage says which): Set records that it was
// given, so that 0 can mean none.
type optionalSize struct {
	n   int64
	set bool
}

func (s *optionalSize) String() string {
	if !s.set {
		return ""
	}
	return formatSize(s.n)
}
func (s *optionalSize) Type() string { return "size" }

// Set takes a size, or "" for not given (as --print-config writes it).
func (s *optionalSize) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		*s = optionalSize{}
		return nil
	}
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	s.n, s.set = n, true
	return nil
}

// option converts the flag for an Options field whose zero is the default
// and a negative value none: not given is 0, given as 0 is -1.
func (s *optionalSize) option() int64 {
	switch {
	case !s.set:
		return 0
	case s.n == 0:
		return -1
	}
	return s.n
}

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

func parseSize(v string) (int64, error) {
	s := strings.ToLower(strings.TrimSpace(v))
	mult := 1.0
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*mult > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is not a size (write it like 64MiB, 1GiB or 4096)", v)
	}
	return int64(f * mult), nil
}

// formatSize writes n in the largest binary unit that keeps it exact, or
// with one decimal when none does and n is at least 1KiB.
func formatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i, v := 0, n
	for i < len(units)-1 && v != 0 && v%1024 == 0 {
		v /= 1024
		i++
	}
	if i == 0 && n >= 1024 {
		f := float64(n)
		for i < len(units)-1 && f >= 1024 {
			f /= 1024
			i++
		}
		return strconv.FormatFloat(f, 'f', 1, 64) + units[i]
	}
	return strconv.FormatInt(v, 10) + units[i]
}
