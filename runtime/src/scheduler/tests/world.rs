//! A recording runtime for scheduler tests: a host-only model of the waiting queue, the running
//! batch, swapped sequences and a paged KV cache of `total_blocks` blocks of the machine's
//! `block_size` tokens. It implements the generated `Actions` and `Guards` with the semantics
//! their doc lines in specs/runtime.toml give, keeps the runtime-written slots current, and
//! records every action in order.

use std::collections::VecDeque;

use crate::scheduler::{Action, Actions, Guards, Slots};

/// One sequence: prompt, tokens generated so far, and the KV blocks it holds on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seq {
    pub id: u32,
    pub prompt: u32,
    pub generated: u32,
    pub max_new: u32,
    pub prefilled: bool,
    pub blocks: u32,
}

#[derive(Debug, thiserror::Error)]
#[error("injected failure of action `{0}`")]
pub struct Injected(pub &'static str);

#[derive(Debug)]
pub struct World {
    pub slots: Slots,
    pub block_size: u32,
    pub total_blocks: u32,
    pub waiting: VecDeque<Seq>,
    pub running: Vec<Seq>,
    pub swapped: Vec<Seq>,
    pub finished: Vec<Seq>,
    /// Every action run, in order.
    pub log: Vec<Action>,
    /// When set, this action fails (once).
    pub fail_next: Option<Action>,
    /// The answer of the `mix_prefill` predicate (prompts run inside decode steps).
    pub mix: bool,
    next_id: u32,
}

impl World {
    pub fn new(slots: Slots, block_size: u32, total_blocks: u32) -> Self {
        Self {
            slots,
            block_size: block_size.max(1),
            total_blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            swapped: Vec::new(),
            finished: Vec::new(),
            log: Vec::new(),
            fail_next: None,
            mix: false,
            next_id: 0,
        }
    }

    /// Queues a request of `prompt` tokens that finishes after `max_new` generated tokens.
    pub fn submit(&mut self, prompt: u32, max_new: u32) -> u32 {
        self.next_id += 1;
        self.waiting.push_back(Seq {
            id: self.next_id,
            prompt,
            generated: 0,
            max_new,
            prefilled: false,
            blocks: 0,
        });
        self.publish();
        self.next_id
    }

    pub fn count(&self, action: Action) -> usize {
        self.log.iter().filter(|a| **a == action).count()
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    pub fn used_blocks(&self) -> u32 {
        self.running.iter().map(|s| s.blocks).sum()
    }

    fn free_blocks(&self) -> u32 {
        self.total_blocks.saturating_sub(self.used_blocks())
    }

    /// Blocks a sequence needs to hold its context plus the next token.
    fn need_next(&self, s: &Seq) -> u32 {
        self.blocks_for(s.prompt + s.generated + 1)
    }

    /// Writes the runtime-owned slots.
    fn publish(&self) {
        self.slots
            .set_pending_request_count(u32::try_from(self.waiting.len()).unwrap_or(u32::MAX));
        self.slots
            .set_batch_size(u32::try_from(self.running.len()).unwrap_or(u32::MAX));
        self.slots.set_kv_blocks_used(self.used_blocks());
    }

    fn record(&mut self, a: Action) -> Result<(), Injected> {
        if self.fail_next == Some(a) {
            self.fail_next = None;
            return Err(Injected(a.name()));
        }
        self.log.push(a);
        Ok(())
    }

    /// One generated token per running sequence (`per_seq` for speculative steps); retires
    /// finished sequences and frees their blocks.
    fn advance(&mut self, per_seq: u32) {
        let mut still = Vec::new();
        for mut s in std::mem::take(&mut self.running) {
            if !s.prefilled {
                still.push(s);
                continue;
            }
            let step = per_seq.min(s.max_new.saturating_sub(s.generated)).max(1);
            s.generated += step;
            s.blocks = s.blocks.max(self.blocks_for(s.prompt + s.generated));
            if s.generated >= s.max_new {
                s.blocks = 0;
                self.finished.push(s);
            } else {
                still.push(s);
            }
        }
        self.running = still;
    }

    /// Runs every unprefilled sequence's prompt and samples its first token; retires those done.
    fn run_prompts(&mut self) {
        for s in self.running.iter_mut().filter(|s| !s.prefilled) {
            s.prefilled = true;
            // The prompt's forward pass samples the first token when none was generated yet;
            // a recomputed (preempted or restored) sequence keeps its tokens.
            if s.generated == 0 {
                s.generated = 1;
            }
        }
        let done: Vec<Seq> = self
            .running
            .iter()
            .filter(|s| s.generated >= s.max_new)
            .cloned()
            .collect();
        self.running.retain(|s| s.generated < s.max_new);
        self.finished.extend(done);
        self.publish();
    }
}

impl Actions for World {
    type Error = Injected;

    fn admit(&mut self) -> Result<(), Injected> {
        self.record(Action::Admit)?;
        while self.can_admit() {
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            let need = self.need_next(&s);
            s.blocks = need;
            s.prefilled = false;
            self.slots.set_current_seq_id(s.id);
            self.running.push(s);
        }
        self.publish();
        Ok(())
    }

    fn prefill(&mut self) -> Result<(), Injected> {
        self.record(Action::Prefill)?;
        self.run_prompts();
        Ok(())
    }

    fn mixed_step(&mut self) -> Result<(), Injected> {
        self.record(Action::MixedStep)?;
        // The decode rows first (the sequences prefilled before this step), then the prompts
        // (here each in one chunk), which get their first token from the same pass.
        self.advance(1);
        self.run_prompts();
        Ok(())
    }

    fn decode(&mut self) -> Result<(), Injected> {
        self.record(Action::Decode)?;
        self.advance(1);
        self.publish();
        Ok(())
    }

    fn draft(&mut self) -> Result<(), Injected> {
        self.record(Action::Draft)
    }

    fn verify(&mut self) -> Result<(), Injected> {
        self.record(Action::Verify)?;
        // Accept every drafted token plus the bonus token.
        self.advance(self.slots.speculative_draft_len().saturating_add(1));
        self.publish();
        Ok(())
    }

    fn preempt(&mut self) -> Result<(), Injected> {
        self.record(Action::Preempt)?;
        if let Some(mut s) = self.running.pop() {
            s.blocks = 0;
            s.prefilled = false;
            self.waiting.push_front(s);
        }
        self.publish();
        Ok(())
    }

    fn swap_out(&mut self) -> Result<(), Injected> {
        self.record(Action::SwapOut)?;
        if let Some(s) = self.running.pop() {
            self.swapped.push(s);
        }
        self.publish();
        Ok(())
    }

    fn swap_in(&mut self) -> Result<(), Injected> {
        self.record(Action::SwapIn)?;
        if self.can_swap_in() {
            let s = self.swapped.remove(0);
            self.running.push(s);
        }
        self.publish();
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<(), Injected> {
        self.record(Action::Checkpoint)?;
        let n = u8::try_from(self.count(Action::Checkpoint) % 256).unwrap_or(0);
        self.slots.set_receipt_digest(&[n; 32]);
        Ok(())
    }

    fn restore(&mut self) -> Result<(), Injected> {
        self.record(Action::Restore)?;
        // The newest checkpoint holds the sequences as they are now; their KV is rebuilt by
        // prefill (recomputation).
        for s in &mut self.running {
            s.prefilled = false;
        }
        self.publish();
        Ok(())
    }
}

impl Guards for World {
    fn can_admit(&self) -> bool {
        let reserve = u32::try_from(self.running.len()).unwrap_or(u32::MAX);
        self.waiting
            .front()
            .is_some_and(|s| self.need_next(s).saturating_add(reserve) <= self.free_blocks())
    }

    fn has_unprefilled(&self) -> bool {
        self.running.iter().any(|s| !s.prefilled)
    }

    fn has_running(&self) -> bool {
        !self.running.is_empty()
    }

    fn mix_prefill(&self) -> bool {
        self.mix
    }

    fn all_finished(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.swapped.is_empty()
    }

    fn kv_exhausted(&self) -> bool {
        let short: u32 = self
            .running
            .iter()
            .map(|s| self.need_next(s).saturating_sub(s.blocks))
            .sum();
        short > self.free_blocks()
    }

    fn has_swapped(&self) -> bool {
        !self.swapped.is_empty()
    }

    fn can_swap_in(&self) -> bool {
        let headroom = u32::try_from(self.running.len()).unwrap_or(u32::MAX);
        self.swapped
            .first()
            .is_some_and(|s| s.blocks.saturating_add(headroom) < self.free_blocks())
    }
}
