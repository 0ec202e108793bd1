package images

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func TestBlobHomes(t *testing.T) {
	repo := func(s string) name.Repository {
		r, err := name.NewRepository("127.0.0.1:5000/" + s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a, b, c := v1.Hash{Algorithm: "sha256", Hex: "aa"}, v1.Hash{Algorithm: "sha256", Hex: "bb"}, v1.Hash{Algorithm: "sha256", Hex: "cc"}
	ctx := context.Background()
	homes := newBlobHomes()
	homes.found(repo("present"), []v1.Hash{a})

	// a is mounted from where it was found; b and c are claimed.
	mounts, done1, err := homes.reserve(ctx, repo("one"), []v1.Hash{a, b, c, b})
	if err != nil || len(mounts) != 1 || mounts[a].String() != repo("present").String() {
		t.Fatalf("reserve: %v %v; want a from present", mounts, err)
	}

	// Another image needing b waits for the first, which fails: then it
	// claims b itself.
	got := make(chan map[v1.Hash]name.Repository)
	var done2 func(bool)
	go func() {
		m, d, err := homes.reserve(ctx, repo("two"), []v1.Hash{b})
		if err != nil {
			t.Error(err)
		}
		done2 = d
		got <- m
	}()
	select {
	case m := <-got:
		t.Fatalf("reserve did not wait for b's upload: %v", m)
	case <-time.After(50 * time.Millisecond):
	}
	done1(false)
	if m := <-got; len(m) != 0 {
		t.Errorf("after a failed upload, mounts %v; want b claimed", m)
	}
	done2(true)

	// b is now two's; c, freed by the failure, has no home.
	mounts, done3, err := homes.reserve(ctx, repo("three"), []v1.Hash{b, c})
	if err != nil || len(mounts) != 1 || mounts[b].String() != repo("two").String() {
		t.Fatalf("reserve: %v %v; want b from two", mounts, err)
	}

	// A wait ends with its context.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := homes.reserve(cctx, repo("four"), []v1.Hash{c}); !errors.Is(err, context.Canceled) {
		t.Errorf("reserve with a cancelled context while c uploads: %v", err)
	}
	done3(true)
	if mounts, _, err := homes.reserve(ctx, repo("three"), []v1.Hash{b, c}); err != nil || len(mounts) != 1 {
		t.Errorf("the repository c's home is: mounts %v %v; want only b", mounts, err)
	}
}
