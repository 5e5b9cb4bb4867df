package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// printConfig writes the effective configuration of fs's flags (after
// layer) as a config file that serve --config reads back: one key a line,
// its value quoted, and a comment naming where the value came from (the
// flag, a KVMESH_* variable, the config file, or the default). from is
// layer's answer; configPath the config file ("" when none).
func printConfig(w io.Writer, fs *pflag.FlagSet, from map[string]string, configPath string) error {
	var b strings.Builder
	b.WriteString("# kvmesh serve: effective configuration (precedence: flag, KVMESH_* variable, config file, default)\n")
	if configPath != "" {
		fmt.Fprintf(&b, "# config file: %s\n", configPath)
	}
	width := 0
	fs.VisitAll(func(f *pflag.Flag) {
		width = max(width, len(f.Name))
	})
	fs.VisitAll(func(f *pflag.Flag) {
		switch f.Name {
		case "config", "help", "print-config":
			return
		}
		fmt.Fprintf(&b, "%-*s %s  # %s\n", width+1, f.Name+":", configLiteral(f), origin(f, from))
	})
	_, err := io.WriteString(w, b.String())
	return err
}

// configLiteral is f's value as a YAML literal: a list for a list flag, a
// quoted string otherwise (so that "off", "1e3" or "" read back as written).
func configLiteral(f *pflag.Flag) string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		items := sv.GetSlice()
		q := make([]string, len(items))
		for i, it := range items {
			q[i] = strconv.Quote(it)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return strconv.Quote(f.Value.String())
}

// origin names where f's value came from.
func origin(f *pflag.Flag, from map[string]string) string {
	if s, ok := from[f.Name]; ok {
		if strings.HasPrefix(s, "KVMESH_") {
			return "env " + s
		}
		return s // "config file PATH: key"
	}
	if f.Changed {
		return "flag --" + f.Name
	}
	return "default"
}
