;; majority_vote.wat: the vote of the `majority_vote` tool, run inside the WebAssembly sandbox.
;;
;; The host (tools/src/majority_vote.rs) extracts and normalises one answer per candidate, writes
;; them into this module's memory and calls `vote`. The module compares the answers byte by byte,
;; counts the votes, picks the winner and classifies the outcome. It imports nothing: no WASI, no
;; host functions, so all it can touch is its own linear memory.
;;
;; ABI (all integers are 32-bit little-endian):
;;
;;   vote(input_ptr, input_len, n, out_ptr) -> status
;;
;;   input: n records, back to back, from input_ptr to input_ptr + input_len:
;;          len (i32; -1 = the candidate has no answer), then len bytes of answer text.
;;   out:   out_ptr + 4 * k for
;;          k = 0            winner: index of the first candidate holding the winning answer,
;;                           -1 when nobody voted
;;          k = 1            top: votes of the winning answer
;;          k = 2            counted: candidates that voted
;;          k = 3            tied: distinct answers holding `top` votes
;;          k = 4            verdict: 0 majority, 1 plurality, 2 tie, 3 no_answer
;;          k = 5 + i        first[i]: index of the first candidate with candidate i's answer,
;;                           -1 when candidate i has none
;;          k = 5 + n + i    votes[i]: votes for candidate i's answer when i == first[i], else 0
;;          k = 5 + 2n + i   scratch: where record i's text starts
;;          k = 5 + 3n + i   scratch: record i's length
;;   status: 0 on success; -1 when the input is malformed (a record runs past the end, a length
;;           below -1, or bytes left over after n records).
;;
;; Rules (the same as the reference implementation `majority_vote::vote` in Rust): the winner has
;; the most votes, the earliest candidate's answer wins among equals; `majority` when the winner
;; holds more than half of the votes cast, `tie` when another answer has as many votes, else
;; `plurality`; `no_answer` when nobody voted.
(module
  (memory (export "memory") 1)

  ;; Address of out[k].
  (func $slot (param $out i32) (param $k i32) (result i32)
    (i32.add (local.get $out) (i32.shl (local.get $k) (i32.const 2))))

  (func $get (param $out i32) (param $k i32) (result i32)
    (i32.load (call $slot (local.get $out) (local.get $k))))

  (func $set (param $out i32) (param $k i32) (param $v i32)
    (i32.store (call $slot (local.get $out) (local.get $k)) (local.get $v)))

  ;; Whether records $i and $j hold the same text (both must have an answer).
  (func $same (param $out i32) (param $n i32) (param $i i32) (param $j i32) (result i32)
    (local $len i32) (local $a i32) (local $b i32) (local $k i32)
    (local.set $len (call $get (local.get $out)
      (i32.add (i32.add (i32.const 5) (i32.mul (local.get $n) (i32.const 3))) (local.get $i))))
    (if (i32.ne (local.get $len)
                (call $get (local.get $out)
                  (i32.add (i32.add (i32.const 5) (i32.mul (local.get $n) (i32.const 3))) (local.get $j))))
      (then (return (i32.const 0))))
    (local.set $a (call $get (local.get $out)
      (i32.add (i32.add (i32.const 5) (i32.shl (local.get $n) (i32.const 1))) (local.get $i))))
    (local.set $b (call $get (local.get $out)
      (i32.add (i32.add (i32.const 5) (i32.shl (local.get $n) (i32.const 1))) (local.get $j))))
    (local.set $k (i32.const 0))
    (block $done
      (loop $bytes
        (br_if $done (i32.ge_u (local.get $k) (local.get $len)))
        (if (i32.ne (i32.load8_u (i32.add (local.get $a) (local.get $k)))
                    (i32.load8_u (i32.add (local.get $b) (local.get $k))))
          (then (return (i32.const 0))))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $bytes)))
    (i32.const 1))

  (func (export "vote") (param $input i32) (param $input_len i32) (param $n i32) (param $out i32)
                        (result i32)
    (local $p i32) (local $end i32) (local $i i32) (local $j i32) (local $len i32)
    (local $first i32) (local $counted i32) (local $top i32) (local $winner i32) (local $tied i32)
    (local $v i32) (local $verdict i32)

    ;; 1. Parse the records into start/length tables.
    (local.set $p (local.get $input))
    (local.set $end (i32.add (local.get $input) (local.get $input_len)))
    (local.set $i (i32.const 0))
    (block $parsed
      (loop $records
        (br_if $parsed (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.gt_u (i32.add (local.get $p) (i32.const 4)) (local.get $end))
          (then (return (i32.const -1))))
        (local.set $len (i32.load (local.get $p)))
        (local.set $p (i32.add (local.get $p) (i32.const 4)))
        (if (i32.lt_s (local.get $len) (i32.const -1))
          (then (return (i32.const -1))))
        (if (i32.ge_s (local.get $len) (i32.const 0))
          (then
            (if (i32.gt_u (local.get $len) (i32.sub (local.get $end) (local.get $p)))
              (then (return (i32.const -1))))))
        (call $set (local.get $out)
          (i32.add (i32.add (i32.const 5) (i32.shl (local.get $n) (i32.const 1))) (local.get $i))
          (local.get $p))
        (call $set (local.get $out)
          (i32.add (i32.add (i32.const 5) (i32.mul (local.get $n) (i32.const 3))) (local.get $i))
          (local.get $len))
        (if (i32.ge_s (local.get $len) (i32.const 0))
          (then (local.set $p (i32.add (local.get $p) (local.get $len)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $records)))
    (if (i32.ne (local.get $p) (local.get $end))
      (then (return (i32.const -1))))

    ;; 2. Group equal answers under their first candidate and count the votes.
    (local.set $i (i32.const 0))
    (block $grouped
      (loop $candidates
        (br_if $grouped (i32.ge_u (local.get $i) (local.get $n)))
        (call $set (local.get $out) (i32.add (i32.add (i32.const 5) (local.get $n)) (local.get $i))
          (i32.const 0))
        (local.set $first (i32.const -1))
        (if (i32.ge_s
              (call $get (local.get $out)
                (i32.add (i32.add (i32.const 5) (i32.mul (local.get $n) (i32.const 3))) (local.get $i)))
              (i32.const 0))
          (then
            (local.set $first (local.get $i))
            (local.set $j (i32.const 0))
            (block $found
              (loop $earlier
                (br_if $found (i32.ge_u (local.get $j) (local.get $i)))
                ;; Only first occurrences are compared: every earlier answer has one.
                (if (i32.eq (call $get (local.get $out) (i32.add (i32.const 5) (local.get $j)))
                            (local.get $j))
                  (then
                    (if (call $same (local.get $out) (local.get $n) (local.get $i) (local.get $j))
                      (then
                        (local.set $first (local.get $j))
                        (br $found)))))
                (local.set $j (i32.add (local.get $j) (i32.const 1)))
                (br $earlier)))
            (local.set $counted (i32.add (local.get $counted) (i32.const 1)))
            (call $set (local.get $out)
              (i32.add (i32.add (i32.const 5) (local.get $n)) (local.get $first))
              (i32.add
                (call $get (local.get $out)
                  (i32.add (i32.add (i32.const 5) (local.get $n)) (local.get $first)))
                (i32.const 1)))))
        (call $set (local.get $out) (i32.add (i32.const 5) (local.get $i)) (local.get $first))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $candidates)))

    ;; 3. The winner: the earliest first occurrence with the most votes; count those tied with it.
    (local.set $winner (i32.const -1))
    (local.set $i (i32.const 0))
    (block $scanned
      (loop $scan
        (br_if $scanned (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $v (call $get (local.get $out)
          (i32.add (i32.add (i32.const 5) (local.get $n)) (local.get $i))))
        (if (i32.gt_u (local.get $v) (i32.const 0))
          (then
            (if (i32.gt_u (local.get $v) (local.get $top))
              (then
                (local.set $top (local.get $v))
                (local.set $winner (local.get $i))
                (local.set $tied (i32.const 1)))
              (else
                (if (i32.eq (local.get $v) (local.get $top))
                  (then (local.set $tied (i32.add (local.get $tied) (i32.const 1)))))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $scan)))

    ;; 4. The verdict.
    (local.set $verdict
      (if (result i32) (i32.lt_s (local.get $winner) (i32.const 0))
        (then (i32.const 3))
        (else
          (if (result i32) (i32.gt_u (i32.shl (local.get $top) (i32.const 1)) (local.get $counted))
            (then (i32.const 0))
            (else
              (if (result i32) (i32.gt_u (local.get $tied) (i32.const 1))
                (then (i32.const 2))
                (else (i32.const 1))))))))

    (call $set (local.get $out) (i32.const 0) (local.get $winner))
    (call $set (local.get $out) (i32.const 1) (local.get $top))
    (call $set (local.get $out) (i32.const 2) (local.get $counted))
    (call $set (local.get $out) (i32.const 3) (local.get $tied))
    (call $set (local.get $out) (i32.const 4) (local.get $verdict))
    (i32.const 0))
)
