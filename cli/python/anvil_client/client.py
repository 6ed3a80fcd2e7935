"""client.py - the RL-facing client: jobs in, complete groups out, weight versions in between.

AnvilClient wraps the broker's client operations (SUBMIT in chunks, WATCH long polls, RESULTS
pages with token ids, CANCEL, WORKERS, UPDATE_WEIGHTS). A generate() call is a Rollout: one
broker job of prompts x n samples, read back as complete groups. The rollout parks a WATCH
(block_ms) on each of its jobs; when terminal events arrive it pulls the new RESULTS page(s)
(in completion order, cursor-based, so each record is read once), files the samples by task,
and a task whose n samples are all terminal becomes a Group. The event stream ids are broker
(Redis) wall-clock milliseconds, which gives each sample the time it became final: the
group's delivery latency is measured from there.

Staleness: the client knows the trainer's weight version (the last update_weights, or the gen
workers' version at start). A group is stale at delivery when its oldest sample is more than
max_weight_lag versions behind; by policy it is generated again in a follow-up job of the same
rollout ("regenerate"), dropped, or kept. Over-provisioning: with want=K the rollout ends after
K groups, cancels its jobs, and keeps complete groups beyond K in `leftover`. Aborted samples
(a WEIGHTS_ABORT update, on a job with keep_aborted) come back with their tokens so far; the
rollout continues each one in a resume job (Task.resume_token_ids: the worker extends the
prompt with them and spends only the remaining max_tokens) and stitches the continuation on,
so the group is delivered whole, its segments saying which version wrote which tokens; the
resume task carries the partial text too (Task.resume_text), so the broker scores the whole
completion, and a continuation aborted again is resumed again.

The broker enforces the staleness bound too (JobSpec.max_weight_lag): a sample whose first
token is from a version more than max_weight_lag behind the current one (the last
update_weights) when it comes back is generated again on current weights, and gen workers
behind the bound get no units of the job. The client's check covers what the broker cannot
see: groups completed before an update but delivered after it.

cancel(keep_partial=True) (and Rollout.abort()) has the gen units in flight send back their
samples so far (finish "cancelled"): they land in `partial` groups, resumable like aborted
ones. score() is the reward-only path: existing completions, scored without generating (a
score-only job), delivered as groups per item.
"""
import asyncio
import os
import time

from ._proto import pb
from .connection import AnvilError, Connection
from .records import Group, Sample, Segment, WeightsUpdate

_POLICIES = {"finish": pb.WEIGHTS_FINISH, "pause": pb.WEIGHTS_PAUSE, "abort": pb.WEIGHTS_ABORT}
_TERMINAL_STATES = (pb.JOB_DONE, pb.JOB_CANCELLED, pb.JOB_FAILED)


def _now_ms():
    return int(time.time() * 1000)


def _sampling(d):
    if d is None:
        return None
    if isinstance(d, pb.SamplingParams):
        return d
    sp = pb.SamplingParams()
    for k, v in d.items():
        if v is None:
            continue
        if k in ("stop", "stop_token_ids"):
            getattr(sp, k).extend(v)
        else:
            setattr(sp, k, v)
    return sp


def _task_ref(d):
    if isinstance(d, pb.TaskRef):
        return d
    ref = pb.TaskRef()
    for k, v in d.items():
        if k == "kind" and isinstance(v, str):
            v = pb.TaskKind.Value(v if v.startswith("TASK_KIND_") else "TASK_KIND_" + v.upper())
        setattr(ref, k, v)
    return ref


def make_task(prompt, custom_id):
    """A pb.Task from a prompt: a string, a list of chat messages, or a dict with `prompt` or
    `messages` and optionally `custom_id`, `ref` (TaskRef fields, for scoring), `sampling`,
    `n`, `resume_token_ids` + `resume_text` (continue a partial sample), or `completion` /
    `completions` (existing completions to score: then no prompt is needed)."""
    t = pb.Task(custom_id=custom_id)
    d = prompt if isinstance(prompt, dict) else None
    if isinstance(prompt, str):
        t.prompt = prompt
    elif isinstance(prompt, (list, tuple)):
        for m in prompt:
            t.messages.add(role=m["role"], content=m["content"])
    elif d is not None:
        if "custom_id" in d:
            t.custom_id = str(d["custom_id"])
        if "prompt" in d:
            t.prompt = d["prompt"]
        for m in d.get("messages", ()):
            t.messages.add(role=m["role"], content=m["content"])
        if d.get("ref"):
            t.ref.CopyFrom(_task_ref(d["ref"]))
        if d.get("sampling"):
            t.sampling.CopyFrom(_sampling(d["sampling"]))
        if d.get("n"):
            t.n = int(d["n"])
        if d.get("resume_token_ids"):
            t.resume_token_ids.extend(int(x) for x in d["resume_token_ids"])
        if d.get("resume_text"):
            t.resume_text = d["resume_text"]
        if "completion" in d:
            t.completions.append(d["completion"])
        t.completions.extend(d.get("completions", ()))
    else:
        raise TypeError("a prompt is a str, a list of messages or a dict, not %r" % type(prompt))
    if not t.prompt and not t.messages and not t.completions:
        raise ValueError("prompt %r has neither text nor messages" % custom_id)
    return t


class _Job:
    """One broker job of a rollout: its read positions and what is not yet a group."""

    def __init__(self, job_id, entries, n):
        self.id = job_id
        self.entries = entries          # task_index -> (kind, payload): see Rollout
        self.n = n
        self.offset = "0"
        self.cursor = ""
        self.state = pb.JOB_QUEUED
        self.open = {}                  # task_index -> {sample_index: Sample}
        self.gen_ms = {}                # (t, s) -> ms of its 'sample' event
        self.term_ms = {}               # (t, s) -> ms of its latest terminal event
        self.watch = None               # the parked WATCH future

    @property
    def finished(self):
        return self.state in _TERMINAL_STATES


class Rollout:
    """An async iterator of complete Groups (see the module comment). Create with
    AnvilClient.generate(); `await rollout.start()` submits early, otherwise the first
    iteration does."""

    def __init__(self, client, prompts, n, sampling, score, scoring, want, max_weight_lag,
                 on_stale, chat, name, priority, keep_aborted, resume_aborted, page_size,
                 score_only=False):
        if on_stale not in ("regenerate", "drop", "keep"):
            raise ValueError("on_stale is regenerate, drop or keep")
        self.client = client
        self.prompts = list(prompts)
        self.n = int(n)
        self.sampling = _sampling(sampling) or pb.SamplingParams()
        self.score = bool(score)
        self.scoring = scoring
        self.want = want
        self.max_weight_lag = max_weight_lag
        self.on_stale = on_stale
        self.chat = chat
        self.name = name
        self.priority = priority
        self.keep_aborted = keep_aborted
        self.resume_aborted = resume_aborted
        self.page_size = page_size
        self.score_only = score_only
        self.jobs = []
        self.ready = []                 # complete groups not yet delivered
        self.leftover = []              # complete groups beyond `want`
        self.dropped = []               # stale groups dropped (on_stale="drop")
        self.incomplete = []            # groups left partial by a cancelled/failed job
        self.partial = []               # groups with samples cut short by cancel(keep_partial)
        self.delivered = 0
        self.regenerations = 0
        self.resumed_samples = 0
        self.cancelled_units = 0
        self._groups = {}               # prompt index -> Group being resumed
        self._regen = {}                # prompt index -> times regenerated
        self._again = []                # (group index, sample) aborted again: resume anew
        self._started = False
        self._closed = False

    # -- submission -----------------------------------------------------------------------
    def _spec(self, n):
        spec = pb.JobSpec(n=n, score=self.score, chat=self.chat, priority=self.priority)
        spec.sampling.CopyFrom(self.sampling)
        if self.name:
            spec.name = self.name
        if self.scoring is not None:
            sc = self.scoring
            spec.scoring.CopyFrom(sc if isinstance(sc, pb.ScoringSpec) else pb.ScoringSpec(**sc))
        if self.max_weight_lag is not None:
            spec.max_weight_lag = int(self.max_weight_lag)
        if self.keep_aborted:
            spec.keep_aborted = True
        if self.score_only:
            spec.score_only = True
            spec.score = True
        return spec

    async def _submit(self, tasks, entries, n):
        job_id = await self.client.submit(self._spec(n), tasks)
        self.jobs.append(_Job(job_id, entries, n))
        return job_id

    async def start(self):
        if self._started:
            return
        self._started = True
        if self.max_weight_lag is not None and self.client.weight_version is None:
            await self.client.refresh_weight_version()
        tasks, entries = [], {}
        for i, p in enumerate(self.prompts):
            tasks.append(make_task(p, "p%d" % i))
            entries[i] = ("prompt", i)
        if tasks:
            await self._submit(tasks, entries, self.n)

    async def _regenerate(self, groups):
        tasks, entries = [], {}
        for g in groups:
            self._regen[g.index] = self._regen.get(g.index, 0) + 1
            tasks.append(make_task(self.prompts[g.index],
                                   "p%d.r%d" % (g.index, self._regen[g.index])))
            entries[len(tasks) - 1] = ("prompt", g.index)
        self.regenerations += len(groups)
        await self._submit(tasks, entries, self.n)

    async def _resume(self, groups, again=()):
        """One n=1 task per aborted sample (of `groups`, and the (group index, sample) pairs in
        `again`): same prompt, resume_token_ids = tokens so far, resume_text = their text."""
        pairs = list(again)
        for g in groups:
            self._groups[g.index] = g
            pairs.extend((g.index, s) for s in g.samples if s.aborted)
        tasks, entries = [], {}
        for gi, s in pairs:
            t = make_task(self.prompts[gi], "p%d.s%d.c%d" % (gi, s.sample_index,
                                                             len(s.segments)))
            t.n = 1
            t.resume_token_ids.extend(s.response_token_ids)
            if s.text:
                t.resume_text = s.text
            tasks.append(t)
            entries[len(tasks) - 1] = ("resume", (gi, s.sample_index))
        if tasks:
            self.resumed_samples += len(tasks)
            await self._submit(tasks, entries, 1)

    # -- reading ------------------------------------------------------------------------------
    def _note_events(self, job, events):
        terminal = 0
        for ev in events:
            if not ev.HasField("task_index") or not ev.HasField("sample_index"):
                continue
            try:
                ms = int(ev.id.split("-")[0])
            except ValueError:
                continue
            key = (ev.task_index, ev.sample_index)
            if ev.type == "sample":
                job.gen_ms[key] = ms
                # generation-only jobs, errors, aborted and cancelled samples are final here
                if not self.score or ev.detail in ("error", "aborted", "cancelled"):
                    job.term_ms[key] = ms
                    terminal += 1
            elif ev.type in ("scored", "dead"):
                job.term_ms[key] = ms
                terminal += 1
        return terminal

    async def _pull_results(self, job):
        got = []
        while True:
            rep = await self.client.results_page(job.id, job.cursor, self.page_size)
            if rep.next_cursor:
                job.cursor = rep.next_cursor
            got.extend(rep.results)
            if len(rep.results) < self.page_size or rep.done:
                break
        if got and any((r.sample.task_index, r.sample.sample_index) not in job.term_ms
                       for r in got):
            # RESULTS read past what the last WATCH returned: catch the events up (no wait)
            w = await self.client.watch(job.id, job.offset, block_ms=0)
            self._note_events(job, w.events)
            job.offset = w.last_offset or job.offset
        for r in got:
            s = Sample.from_pb(r.sample, r.exec if r.HasField("exec") else None)
            key = (s.task_index, s.sample_index)
            s.terminal_ms = job.term_ms.get(key)
            s.generated_ms = job.gen_ms.get(key, s.terminal_ms)
            job.open.setdefault(s.task_index, {})[s.sample_index] = s
        return self._close_groups(job)

    def _close_groups(self, job):
        done = []
        for t in list(job.open):
            entry = job.entries.get(t)
            if entry is None:
                del job.open[t]  # not a task of ours (cannot happen on a fresh job)
                continue
            kind, ref = entry
            need = job.n if kind == "resume" else self._n_of(ref)
            if len(job.open[t]) < need:
                continue
            samples = [job.open[t][k] for k in sorted(job.open[t])]
            del job.open[t]
            if kind == "prompt":
                done.append(Group(index=ref, prompt=self.prompts[ref], samples=samples,
                                  custom_id=self._custom_id(ref), job_id=job.id,
                                  regenerated=self._regen.get(ref, 0)))
            else:
                g = self._stitch(ref, samples[0])
                if g is not None:
                    done.append(g)
        return done

    def _n_of(self, i):
        p = self.prompts[i]
        if self.score_only and isinstance(p, dict):
            return len(p.get("completions", ())) + (1 if "completion" in p else 0)
        return int(p["n"]) if isinstance(p, dict) and p.get("n") else self.n

    def _custom_id(self, i):
        p = self.prompts[i]
        return str(p["custom_id"]) if isinstance(p, dict) and "custom_id" in p else "p%d" % i

    def _stitch(self, ref, cont):
        """Appends a continuation to the aborted sample it resumes; returns the group once no
        sample of it is still aborted."""
        gi, si = ref
        g = self._groups.get(gi)
        if g is None:
            return None
        s = next(x for x in g.samples if x.sample_index == si)
        start = len(s.response_token_ids)
        s.response_token_ids += cont.response_token_ids
        s.logprobs += cont.logprobs
        s.response_mask += [1] * len(cont.response_token_ids)
        s.segments.append(Segment(start, len(s.response_token_ids), cont.weight_version))
        s.weight_version = min(s.weight_version, cont.weight_version)
        s.finish_reason = cont.finish_reason
        s.text += cont.text
        s.error = cont.error
        # scored by the broker on the whole text (resume_text + continuation)
        s.exec, s.exec_status, s.reward = cont.exec, cont.exec_status, cont.reward
        s.terminal_ms, s.generated_ms = cont.terminal_ms, cont.generated_ms
        s.worker_id = cont.worker_id
        if s.aborted and self.resume_aborted:
            self._again.append((gi, s))  # aborted again (another update): continue it anew
        if any(x.aborted for x in g.samples):
            return None
        del self._groups[gi]
        return g

    async def _absorb(self, groups):
        """Routes complete groups: resume the aborted ones, queue the rest for delivery."""
        abort = [g for g in groups if self.resume_aborted and any(s.aborted for s in g.samples)]
        again, self._again = self._again, []
        if abort or again:
            await self._resume(abort, again)
        self.ready.extend(g for g in groups if g not in abort)

    async def _step(self):
        """Waits for any live job to have news; reads it. False when nothing is live."""
        live = [j for j in self.jobs if not j.finished]
        if not live:
            return False
        for j in live:
            if j.watch is None:
                j.watch = asyncio.ensure_future(
                    self.client.watch(j.id, j.offset, block_ms=self.client.watch_block_ms))
        await asyncio.wait([j.watch for j in live], return_when=asyncio.FIRST_COMPLETED)
        for j in live:
            if not j.watch.done():
                continue
            rep = j.watch.result()
            j.watch = None
            if rep.last_offset:
                j.offset = rep.last_offset
            if rep.HasField("status"):
                j.state = rep.status.state
            if self._note_events(j, rep.events) or j.finished:
                await self._absorb(await self._pull_results(j))
            if j.finished and j.open:
                for t, ss in j.open.items():
                    kind, ref = j.entries.get(t, ("?", None))
                    self.incomplete.append((j.id, kind, ref, sorted(ss.values(),
                                            key=lambda s: s.sample_index)))
                j.open = {}
        return True

    def _stale(self, g):
        cur = self.client.weight_version
        return (self.max_weight_lag is not None and cur is not None
                and g.oldest_version + self.max_weight_lag < cur)

    # -- the iterator -----------------------------------------------------------------------
    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._closed:
            raise StopAsyncIteration
        await self.start()
        while True:
            while self.ready:
                g = self.ready.pop(0)
                if self._stale(g):
                    if self.on_stale == "regenerate":
                        await self._regenerate([g])
                        continue
                    if self.on_stale == "drop":
                        self.dropped.append(g)
                        continue
                g.delivered_ms = _now_ms()
                self.delivered += 1
                if self.want is not None and self.delivered >= self.want:
                    await self.cancel()
                return g
            if not await self._step():
                self._closed = True
                raise StopAsyncIteration

    async def cancel(self, keep_partial=False):
        """Cancels every live job of the rollout; complete groups not yet delivered move to
        `leftover`. The iterator then ends. With keep_partial, the samples in flight come back
        with their tokens so far (finish "cancelled"): groups that hold any are in `partial`,
        whole ones in `leftover`."""
        self._closed = True
        cut = []
        for j in self.jobs:
            if j.watch is not None:
                j.watch.cancel()
                j.watch = None
            if not j.finished:
                try:
                    self.cancelled_units += await self.client.cancel(j.id, keep_partial)
                    cut.append(j)
                except AnvilError as e:
                    if e.code is None:
                        raise
                j.state = pb.JOB_CANCELLED
        for j in cut if keep_partial else ():
            # the broker answered once the partial samples were recorded: read them
            w = await self.client.watch(j.id, j.offset, block_ms=0)
            self._note_events(j, w.events)
            j.offset = w.last_offset or j.offset
            for g in await self._pull_results(j):
                if any(s.finish_reason == "cancelled" for s in g.samples):
                    self.partial.append(g)
                else:
                    self.ready.append(g)
        self.leftover.extend(self.ready)
        self.ready = []

    async def abort(self):
        """cancel(keep_partial=True); returns the `partial` groups."""
        await self.cancel(keep_partial=True)
        return self.partial

    async def collect(self):
        """Every group, as a list (until `want` or the end of the jobs)."""
        return [g async for g in self]


class AnvilClient:
    """The broker's client operations for an RL trainer. Use from one asyncio loop:

        async with AnvilClient("tcp://broker:5555") as c:
            async for group in c.generate(prompts, n=8, sampling={"temperature": 1.0,
                                                                  "max_tokens": 1024}):
                ...
            await c.update_weights("/ckpt/step-1", version=1)
    """

    def __init__(self, endpoint=None, timeout_s=30.0, watch_block_ms=5000, chunk_tasks=1000,
                 curve_secret=None, curve_server=None):
        self.endpoint = endpoint or os.environ.get("ANVIL_BROKER", "tcp://127.0.0.1:5555")
        self.conn = Connection(self.endpoint, timeout_s, curve_secret, curve_server)
        self.watch_block_ms = watch_block_ms
        self.chunk_tasks = chunk_tasks
        self.weight_version = None     # the trainer's version as far as the client knows

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        await self.conn.close()

    # -- plain operations ---------------------------------------------------------------------
    async def submit(self, spec, tasks):
        """Submits a job in chunks; returns its id once the broker has it durable."""
        job_id = None
        tasks = list(tasks)
        chunks = [tasks[i:i + self.chunk_tasks] for i in range(0, len(tasks), self.chunk_tasks)]
        for k, chunk in enumerate(chunks or [[]]):
            req = pb.SubmitRequest(chunk_index=k, final=k == len(chunks or [[]]) - 1)
            if job_id is None:
                req.spec.CopyFrom(spec)
            else:
                req.job_id = job_id
            req.tasks.extend(chunk)
            rep = await self.conn.request("submit", req, "submit_reply")
            job_id = rep.job_id
        return job_id

    async def status(self, job_id):
        rep = await self.conn.request("status", pb.StatusRequest(job_id=job_id), "status_reply")
        return rep.jobs[0]

    async def watch(self, job_id, offset="0", block_ms=0, max_events=10000):
        req = pb.WatchRequest(job_id=job_id, from_offset=offset, block_ms=block_ms,
                              max_events=max_events)
        return await self.conn.request("watch", req, "watch_reply",
                                       timeout_s=self.conn.timeout_s + block_ms / 1000.0)

    async def results_page(self, job_id, cursor="", page_size=500, with_tokens=True):
        req = pb.ResultsRequest(job_id=job_id, cursor=cursor, page_size=page_size,
                                with_tokens=with_tokens)
        return await self.conn.request("results", req, "results_reply")

    async def cancel(self, job_id, keep_partial=False, partial_wait_ms=None):
        """Cancels a job; returns the units that will not run. With keep_partial the gen units
        in flight send back their samples so far (finish "cancelled", recorded as results), and
        the reply comes once they are in (or after partial_wait_ms, default 10 s)."""
        req = pb.CancelRequest(job_id=job_id)
        wait_s = 0.0
        if keep_partial:
            req.keep_partial = True
            if partial_wait_ms is not None:
                req.partial_wait_ms = int(partial_wait_ms)
            wait_s = (partial_wait_ms if partial_wait_ms is not None else 10000) / 1000.0
        rep = await self.conn.request("cancel", req, "cancel_reply",
                                      timeout_s=self.conn.timeout_s + wait_s)
        return rep.cancelled

    async def workers(self):
        rep = await self.conn.request("workers", pb.WorkersRequest(), "workers_reply")
        return list(rep.workers)

    async def refresh_weight_version(self):
        """Takes the trainer's version from the live gen workers (the highest they report)."""
        vs = [w.weight_version for w in await self.workers()
              if w.kind == pb.WORKER_GEN and w.state != "dead"]
        self.weight_version = max(vs) if vs else None
        return self.weight_version

    # -- RL ------------------------------------------------------------------------------------
    def generate(self, prompts, n, sampling=None, score=True, *, want=None, max_weight_lag=None,
                 on_stale="regenerate", chat=True, scoring=None, name=None, priority=0,
                 keep_aborted=False, resume_aborted=None, page_size=500):
        """A Rollout: an async iterator of complete groups (n samples per prompt, with prompt
        and response token ids, fp32 logprobs, response mask, finish reason, weight version,
        and with score=True the exec result and reward). `want`: stop after that many groups
        and cancel the rest. `max_weight_lag`: the staleness bound (see on_stale).
        `keep_aborted`: samples aborted by a weights update come back partial and are resumed
        (resume_aborted, default on) with the remaining token budget."""
        if resume_aborted is None:
            resume_aborted = keep_aborted
        return Rollout(self, prompts, n, sampling, score, scoring, want, max_weight_lag,
                       on_stale, chat, name, priority, keep_aborted, resume_aborted, page_size)

    def score(self, items, scoring=None, *, name=None, priority=0, page_size=500):
        """The reward-only path: re-scores existing completions without generating. Each item
        is a dict with `completion` (a string) or `completions` (a list), `ref` (the TaskRef
        fields: kind, name, reference_code, test_code) and optionally `custom_id` and
        `prompt`. Returns a Rollout in score-only mode: an async iterator of one Group per
        item (in completion order; group.index is the item's position), sample k scored from
        completion k, with exec_status, reward and the exec record."""
        items = list(items)
        for i, it in enumerate(items):
            if not isinstance(it, dict) or not it.get("ref"):
                raise ValueError("score item %d needs a dict with 'ref' (the task to score "
                                 "against)" % i)
            k = len(it.get("completions", ())) + (1 if "completion" in it else 0)
            if not 1 <= k <= 4096:
                raise ValueError("score item %d needs 1 to 4096 completions, not %d" % (i, k))
        return Rollout(self, items, 1, None, True, scoring, None, None, "keep", True, name,
                       priority, False, False, page_size, score_only=True)

    async def update_weights(self, checkpoint_dir, version, policy="finish", timeout_s=1800.0,
                             min_workers=1):
        """Has every gen worker load `checkpoint_dir` as `version` (policy finish, pause or
        abort for in-flight sequences); returns when all of them report it, with the slowest
        load and the control-plane time beyond it. Raises AnvilError if fewer than
        min_workers gen workers took part or one failed to load."""
        if policy not in _POLICIES:
            raise ValueError("policy is finish, pause or abort")
        if not os.path.isabs(checkpoint_dir):
            checkpoint_dir = os.path.abspath(checkpoint_dir)
        req = pb.UpdateWeightsRequest(version=int(version), checkpoint_dir=checkpoint_dir,
                                      policy=_POLICIES[policy])
        t0 = time.perf_counter()
        rep = await self.conn.request("update_weights", req, "update_weights_reply",
                                      timeout_s=timeout_s)
        total_ms = (time.perf_counter() - t0) * 1000.0
        if rep.workers < min_workers:
            raise AnvilError("weights v%d reached %d gen workers, fewer than %d"
                             % (version, rep.workers, min_workers))
        self.weight_version = int(version)
        return WeightsUpdate(version=rep.version, workers=rep.workers, load_s=rep.seconds,
                             control_ms=rep.control_ms, total_ms=total_ms, policy=policy)
