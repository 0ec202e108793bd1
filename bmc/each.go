package bmc

import (
	"context"
	"sync"
)

// Result is one machine's outcome of a call made to many.
type Result[T any] struct {
	Machine string
	Value   T
	Err     error
}

// DefaultParallel bounds how many BMCs are driven at once: enough for a
// rack, few enough not to flood a management network whose BMCs answer
// slowly.
const DefaultParallel = 16

// Each calls fn for every machine, at most parallel at once, and returns
// the results in the machines' order. One machine's failure or hang (each
// call is bounded by its own timeout) does not stop the others.
func Each[T any](ctx context.Context, machines []string, parallel int, fn func(ctx context.Context, machine string) (T, error)) []Result[T] {
	if parallel <= 0 {
		parallel = DefaultParallel
	}
	results := make([]Result[T], len(machines))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, m := range machines {
		results[i].Machine = m
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				results[i].Err = ctx.Err()
				return
			}
			defer func() { <-sem }()
			results[i].Value, results[i].Err = fn(ctx, m)
		})
	}
	wg.Wait()
	return results
}
