// dockerfile-check parses a Dockerfile with BuildKit's own parser and instruction parser (what
// `docker build` runs first) and fails on a parse error or on any warning of the lint rules that
// BuildKit applies while parsing instructions. Used by image-layout.test.ts; built by build.sh.
package main

import (
	"fmt"
	"os"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: dockerfile-check DOCKERFILE")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "parse:", err)
		os.Exit(1)
	}
	for _, w := range res.Warnings {
		fmt.Printf("warning: %s (line %d)\n", w.Short, w.Location.Start.Line)
	}
	warnings := len(res.Warnings)
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		warnings++
		line := 0
		if len(loc) > 0 {
			line = loc[0].Start.Line
		}
		fmt.Printf("lint %s: %s (line %d)\n", rule, msg, line)
	}})
	stages, _, err := instructions.Parse(res.AST, lint)
	if err != nil {
		fmt.Fprintln(os.Stderr, "instructions:", err)
		os.Exit(1)
	}
	for _, s := range stages {
		fmt.Printf("stage %s from %s: %d instructions\n", s.Name, s.BaseName, len(s.Commands))
	}
	if warnings > 0 {
		os.Exit(1)
	}
}
