package main

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

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
// default. The config flag itself and help are skipped.
func layer(fs *pflag.FlagSet, lookupEnv func(string) (string, bool), config map[string]string, configPath string) error {
	for k := range config {
		if f := fs.Lookup(k); f == nil || k == "config" || k == "help" {
			return fmt.Errorf("config file %s: unknown key %q (the keys are the long flag names of the command)", configPath, k)
		}
	}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "config" || f.Name == "help" {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
			}
			return
		}
		if v, ok := config[f.Name]; ok {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("config file %s: %s: %q: %w", configPath, f.Name, v, e)
			}
		}
	})
	return err
}

// readConfig reads a YAML config file of flag names and values. Lists (for
// --join) become comma-separated values.
func readConfig(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		switch v := v.(type) {
		case []any:
			parts := make([]string, len(v))
			for i, p := range v {
				parts[i] = fmt.Sprint(p)
			}
			out[k] = strings.Join(parts, ",")
		case map[string]any:
			return nil, fmt.Errorf("config file %s: %s: want a value, not a mapping", path, k)
		case nil:
			out[k] = ""
		default:
			out[k] = fmt.Sprint(v)
		}
	}
	return out, nil
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
