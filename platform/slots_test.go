package platform

import (
	"context"
	"testing"
	"testing/synctest"
)

// TestSlotsShareFairly, in a bubble: a node's first closure is admitted past the cluster-wide
// count, its second only under it, a third never while two run; when a slot frees, the waiting
// closure of the node with the fewest running goes first, and one that gives up waiting leaves
// the line without holding a slot.
func TestSlotsShareFairly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSlots(2, 3)
		ctx := context.Background()
		for _, n := range []string{"a", "b", "c", "d"} { // d is past the count of 3: first closures go in
			if !s.acquire(ctx, n) {
				t.Fatalf("%s's first closure not admitted", n)
			}
		}
		if got := s.inflight(); got != 4 {
			t.Fatalf("in flight %d", got)
		}
		var order []string
		wait := func(node string) {
			go func() {
				if s.acquire(ctx, node) {
					order = append(order, node) // bubble-serialised: each grant is awaited below
				}
			}()
			synctest.Wait()
		}
		wait("a") // a second closure: the cluster is at 4 ≥ 3, it waits
		wait("b")
		if len(order) != 0 {
			t.Fatalf("second closures admitted past the cluster count: %v", order)
		}
		if !s.acquire(ctx, "e") { // a newcomer still goes in at once
			t.Fatal("a node without a closure running waited")
		}
		s.release("c") // 4 running: still at the count, nobody goes
		synctest.Wait()
		s.release("d") // 3: still at the count
		synctest.Wait()
		if len(order) != 0 {
			t.Fatalf("admitted at the count: %v", order)
		}
		s.release("e") // 2 running (a, b): a's second goes (first in line)
		synctest.Wait()
		if len(order) != 1 || order[0] != "a" {
			t.Fatalf("admitted %v, want a", order)
		}
		// Now a runs 2, b runs 1 with its second waiting; a wants a third: the node limit holds it.
		wait("a")
		s.release("a") // 2 running: b (1 running) before a (1 running, later in line)
		synctest.Wait()
		if len(order) != 2 || order[1] != "b" {
			t.Fatalf("admitted %v, want b next", order)
		}
		// a runs 1, b runs 2, a's third waits; c, none running, goes at once; its second gives up
		// waiting and holds nothing.
		if !s.acquire(ctx, "c") {
			t.Fatal("c waited")
		}
		ctxGone, cancel := context.WithCancel(ctx)
		gaveUp := make(chan bool, 1)
		go func() { gaveUp <- s.acquire(ctxGone, "c") }()
		synctest.Wait()
		cancel()
		if <-gaveUp {
			t.Fatal("a cancelled wait holds a slot")
		}
		s.release("b") // 3 running: a's waiting closure (a runs 1) is still at the count
		synctest.Wait()
		s.release("c") // 2 running: a goes
		synctest.Wait()
		if len(order) != 3 || order[2] != "a" {
			t.Fatalf("admitted %v, want a last", order)
		}
		if got := s.inflight(); got != 3 {
			t.Fatalf("in flight %d, want 3", got)
		}
	})
}

// TestSlotsFewestRunningFirst: of two closures waiting, the one whose node runs fewer goes first,
// whatever their order in line.
func TestSlotsFewestRunningFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSlots(3, 4)
		ctx := context.Background()
		for _, n := range []string{"x", "x", "x", "y"} { // x runs 3 (its limit), y runs 1: at the count
			s.acquire(ctx, n)
		}
		s.release("x") // x runs 2: 3 running, room for one
		s.acquire(ctx, "x")
		var got []string
		for _, n := range []string{"x", "y"} { // x (2 running) in line before y (1 running)
			go func() {
				if s.acquire(ctx, n) {
					got = append(got, n)
				}
			}()
			synctest.Wait()
		}
		s.release("x") // x runs 2, y 1: y goes first though it came later
		synctest.Wait()
		if len(got) != 1 || got[0] != "y" {
			t.Fatalf("admitted %v, want y", got)
		}
		s.release("y") // and then x
		synctest.Wait()
		if len(got) != 2 || got[1] != "x" {
			t.Fatalf("admitted %v, want y then x", got)
		}
	})
}
