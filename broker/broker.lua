-- broker.lua - every state transition of the broker, as one Redis script.
--
-- The broker loads this script once (SCRIPT LOAD) and calls it with EVALSHA; ARGV[1] names the
-- operation. Each call is atomic (Redis runs one script at a time), so a transition is either
-- wholly applied or not at all; errors are detected before the first write. Calls work on
-- batches (a chunk of tasks, a batch of leases, a batch of results) so that the per-task cost
-- is a few commands inside Redis and no network round trip. Key layout: broker/README.md.
-- Times are wall-clock Unix milliseconds passed in by the broker (scripts stay deterministic).
-- Keys are built inside the script from job ids: Anvil uses a single (non-cluster) Redis.

local P = 'anv:'
local ACTIVE = P .. 'active'
local LEASES = P .. 'leases'

local function jk(j, s)
    if s then
        return P .. 'job:' .. j .. ':' .. s
    end
    return P .. 'job:' .. j
end

local function num(v, d)
    local x = tonumber(v)
    if x == nil then
        return d
    end
    return x
end

local function ev(j, typ, t, s, detail, term)
    return redis.call('XADD', jk(j, 'events'), '*', 'type', typ, 't', t, 's', s, 'd', detail,
                      'term', term)
end

-- one event for a list of samples ("t:s" strings): field `ts` holds them comma-separated
local function ev_list(j, typ, list, detail, term)
    return redis.call('XADD', jk(j, 'events'), '*', 'type', typ, 'ts', table.concat(list, ','),
                      'd', detail, 'term', term)
end

local function live(state)
    return state == 'queued' or state == 'running'
end

-- call `cmd key` with `args` split into pieces small enough for unpack()
local function chunked(cmd, key, args, step)
    local n = #args
    local i = 1
    while i <= n do
        local last = math.min(i + step - 1, n)
        redis.call(cmd, key, unpack(args, i, last))
        i = last + 1
    end
end

-- HMGET of any number of fields (unpack() has a limit): the values, in order, false if absent
local function hmget(key, fields)
    local n = #fields
    if n <= 4000 then
        return redis.call('HMGET', key, unpack(fields))
    end
    local out = {}
    local i = 1
    while i <= n do
        local last = math.min(i + 3999, n)
        local part = redis.call('HMGET', key, unpack(fields, i, last))
        for k = 1, #part do
            out[i + k - 1] = part[k]
        end
        i = last + 1
    end
    return out
end

local function check_done(j, now)
    local v = redis.call('HMGET', jk(j), 'final', 'terminal', 'samples_total', 'state')
    if v[1] == '1' and live(v[4]) and num(v[2], 0) >= num(v[3], 0) then
        redis.call('HSET', jk(j), 'state', 'done', 'finished_ms', now)
        redis.call('SREM', ACTIVE, j)
        ev(j, 'done', '', '', '', '0')
        return 1
    end
    return 0
end

-- samples of task t: its override or the job's n
local function samples_of(j, t, jn, tn_any)
    if tn_any == '1' then
        return num(redis.call('HGET', jk(j, 'tn'), t), jn)
    end
    return jn
end

-- lease id: kind.job.task[.sample].attempt.seq  (seq makes every dispatch unique)
local function parse_lease(lid)
    local p = {}
    for part in string.gmatch(lid, '[^.]+') do
        p[#p + 1] = part
    end
    if p[1] == 'g' and #p == 5 then
        return 'g', p[2], p[3], nil, num(p[4], 1)
    elseif p[1] == 'e' and #p == 6 then
        return 'e', p[2], p[3], p[4], num(p[5], 1)
    end
    return nil
end

-- protobuf fields appended to a packed message (a later occurrence of a field wins when it is
-- decoded): a varint field, and a length-delimited one of at most 127 bytes
local function pb_varint(field, x)
    local out = {string.char(field * 8)}
    while x >= 128 do
        out[#out + 1] = string.char(x % 128 + 128)
        x = math.floor(x / 128)
    end
    out[#out + 1] = string.char(x)
    return table.concat(out)
end

local function pb_short_bytes(field, v)
    return string.char(field * 8 + 2, #v) .. v
end

------------------------------------------------------------------------------------------------
-- create now job_id idem_key spec name priority n score max_attempts tenant score_only
--   -> {job_id, existing(0|1)}
local function op_create(a)
    local now, j, idem = a[2], a[3], a[4]
    if idem ~= '' then
        local old = redis.call('GET', P .. 'idem:' .. idem)
        if old then
            return {old, 1}
        end
    end
    if redis.call('EXISTS', jk(j)) == 1 then
        return {j, 1}
    end
    redis.call('HSET', jk(j), 'spec', a[5], 'name', a[6], 'priority', a[7], 'n', a[8],
               'score', a[9], 'max_attempts', a[10], 'tenant', a[11], 'state', 'submitting',
               'created_ms', now, 'tasks', 0, 'samples_total', 0, 'cursor', 0, 'final', 0,
               'tn_any', 0, 'terminal', 0)
    if a[12] == '1' then
        redis.call('HSET', jk(j), 'score_only', 1)
    end
    redis.call('ZADD', P .. 'jobs', now, j)
    redis.call('SADD', ACTIVE, j)
    if idem ~= '' then
        redis.call('SET', P .. 'idem:' .. idem, j)
    end
    return {j, 0}
end

-- submit now job final count chunk_key xkinds {custom_id task_bytes n}*count
--   -> {accepted, skipped, tasks, exec_added}
-- A score-only job (`score_only` set at create) has {custom_id task_bytes n sample_bytes*n}
-- per task instead: its samples (packed Sample, the completion as text, no task index or job
-- id yet: the script appends them) are recorded at once and queued for scoring.
-- xkinds: bit mask of the task kinds in the chunk (1 << TaskKind), or-ed into the job's
-- `xkinds`: exec units go only to workers that can score every kind the job has.
-- A chunk key ('' = none) makes a retried chunk (lost reply) answer as before, adding nothing.
local function op_submit(a)
    local now, j, final, cnt, ck = a[2], a[3], a[4], num(a[5], 0), a[6]
    local jh = jk(j)
    if ck ~= '' then
        local prev = redis.call('HGET', jk(j, 'chunks'), ck)
        if prev then
            local acc, skip, tasks = string.match(prev, '^(%d+) (%d+) (%d+)$')
            return {num(acc, 0), num(skip, 0), num(tasks, 0)}
        end
    end
    local v = redis.call('HMGET', jh, 'state', 'tasks', 'samples_total', 'n', 'final', 'xkinds',
                         'score_only')
    if not v[1] then
        return redis.error_reply('ENOTFOUND no such job')
    end
    local so = v[7] == '1'
    -- the chunk's tasks: {cid, body, n, first sample argument}
    local ents = {}
    local at = 8
    for i = 1, cnt do
        local e = {a[at], a[at + 1], num(a[at + 2], 0), at + 3}
        if e[1] == nil or e[2] == nil then
            return redis.error_reply('EPROTO truncated submit arguments')
        end
        ents[i] = e
        at = at + 3
        if so then
            at = at + e[3]
        end
    end
    local xk = bit.bor(num(v[6], 0), num(a[7], 0))
    local state = v[1]
    if state == 'cancelled' or state == 'failed' then
        return redis.error_reply('ESTATE job is ' .. state)
    end
    -- a job that is final takes no new tasks; re-submitting ones it has is fine (skipped)
    if v[5] == '1' then
        for i = 1, cnt do
            local cid = ents[i][1]
            if cid == '' or redis.call('HEXISTS', jk(j, 'cid'), cid) == 0 then
                return redis.error_reply('ESTATE job is final and takes no new tasks')
            end
        end
        return {0, cnt, num(v[2], 0), 0}
    end
    local idx, tot, n = num(v[2], 0), num(v[3], 0), num(v[4], 1)
    local acc, skip = 0, 0
    local hs, tn, res, xq = {}, {}, {}, {}
    local jid = pb_short_bytes(1, j)
    for i = 1, cnt do
        local cid, body, tnv = ents[i][1], ents[i][2], ents[i][3]
        if cid ~= '' and redis.call('HSETNX', jk(j, 'cid'), cid, idx) == 0 then
            skip = skip + 1
        else
            hs[#hs + 1] = idx
            hs[#hs + 1] = body
            if so then
                local ti = pb_varint(2, idx)
                for s = 0, tnv - 1 do
                    local f = idx .. ':' .. s
                    res[#res + 1] = f
                    res[#res + 1] = a[ents[i][4] + s] .. jid .. ti
                    xq[#xq + 1] = f
                end
            end
            if tnv > 0 then
                tn[#tn + 1] = idx
                tn[#tn + 1] = tnv
                tot = tot + tnv
            else
                tot = tot + n
            end
            idx = idx + 1
            acc = acc + 1
        end
    end
    chunked('HSET', jk(j, 'tasks'), hs, 4000)
    if #tn > 0 then
        chunked('HSET', jk(j, 'tn'), tn, 4000)
        redis.call('HSET', jh, 'tn_any', 1)
    end
    if state == 'submitting' then
        state = 'queued'
    end
    redis.call('HSET', jh, 'tasks', idx, 'samples_total', tot, 'state', state, 'xkinds', xk)
    if final == '1' then
        redis.call('HSET', jh, 'final', 1)
    end
    ev(j, 'submitted', '', '', 'accepted=' .. acc .. ' skipped=' .. skip, '0')
    if so then
        -- nothing to generate: the completions are the samples, recorded and queued to score
        redis.call('HSET', jh, 'cursor', idx)
        if #xq > 0 then
            chunked('HSET', jk(j, 'res'), res, 4000)
            chunked('RPUSH', jk(j, 'xq'), xq, 4000)
            redis.call('HINCRBY', jh, 'generated', #xq)
            ev_list(j, 'sample', xq, 'imported', '0')
        end
    end
    if ck ~= '' then
        redis.call('HSET', jk(j, 'chunks'), ck, acc .. ' ' .. skip .. ' ' .. idx)
    end
    if final == '1' then
        check_done(j, now)
    end
    return {acc, skip, idx, #xq}
end

-- create_submit now job_id idem_key spec name priority n score max_attempts tenant score_only
--               final count chunk_key xkinds {custom_id task_bytes n}*count
--   -> {job_id, existing(0|1), accepted, skipped, tasks, exec_added}
-- The first chunk of a job creates it (or finds it by its idempotency key) in the same call.
local function op_create_submit(a)
    local c = op_create(a)
    local b = {'submit', a[2], c[1]}
    for i = 13, #a do
        b[#b + 1] = a[i]
    end
    local r = op_submit(b)
    if r.err then
        return r
    end
    return {c[1], c[2], r[1], r[2], r[3], r[4]}
end

------------------------------------------------------------------------------------------------
-- lease now lease_ms ngroups {job kind(g|e) count}*ngroups
--   -> {units, counts}
--   units: 9 strings per unit: kind job lease_id task samples(csv, '' = all) n attempt
--          task_bytes sample_bytes
--   counts: 5 per group: job state retry_len fresh_left exec_len
local function op_lease(a)
    local now, exp = num(a[2], 0), num(a[2], 0) + num(a[3], 0)
    local exps = tostring(exp)
    local ng = num(a[4], 0)
    local units, counts, z = {}, {}, {}
    local seq = redis.call('INCRBY', P .. 'lease_seq', 1) * 100000
    local function push(kind, j, t, s, n, att, body, sbody)
        seq = seq + 1
        local lid
        if kind == 'g' then
            lid = 'g.' .. j .. '.' .. t .. '.' .. att .. '.' .. seq
        else
            lid = 'e.' .. j .. '.' .. t .. '.' .. s .. '.' .. att .. '.' .. seq
        end
        z[#z + 1] = exps
        z[#z + 1] = lid
        local u = #units
        units[u + 1], units[u + 2], units[u + 3], units[u + 4] = kind, j, lid, t
        units[u + 5], units[u + 6], units[u + 7] = s, n, att
        units[u + 8], units[u + 9] = body or '', sbody or ''
    end
    for g = 0, ng - 1 do
        local j, kind, want = a[5 + 3 * g], a[6 + 3 * g], num(a[7 + 3 * g], 0)
        local jh = jk(j)
        local v = redis.call('HMGET', jh, 'state', 'cursor', 'tasks', 'n', 'tn_any')
        local got = 0
        if live(v[1]) and kind == 'g' then
            local jn = num(v[4], 1)
            while got < want do
                local t = redis.call('LPOP', jk(j, 'retry'))
                if not t then
                    break
                end
                local n = samples_of(j, t, jn, v[5])
                local rem = {}
                for s = 0, n - 1 do
                    local f = t .. ':' .. s
                    if redis.call('HEXISTS', jk(j, 'res'), f) == 0 and
                        redis.call('HEXISTS', jk(j, 'dead'), f) == 0 then
                        rem[#rem + 1] = s
                    end
                end
                if #rem > 0 then
                    local att = num(redis.call('HGET', jk(j, 'att'), 'g:' .. t), 0) + 1
                    push('g', j, t, table.concat(rem, ','), n, att,
                         redis.call('HGET', jk(j, 'tasks'), t), '')
                    got = got + 1
                end
            end
            local cur, tasks = num(v[2], 0), num(v[3], 0)
            local k = math.min(want - got, tasks - cur)
            if k > 0 then
                local fields = {}
                for i = 1, k do
                    fields[i] = cur + i - 1
                end
                local bodies = hmget(jk(j, 'tasks'), fields)
                local ns = nil
                if v[5] == '1' then
                    ns = hmget(jk(j, 'tn'), fields)
                end
                for i = 1, k do
                    local n = jn
                    if ns and ns[i] then
                        n = num(ns[i], jn)
                    end
                    push('g', j, cur + i - 1, '', n, 1, bodies[i], '')
                end
                redis.call('HSET', jh, 'cursor', cur + k)
                got = got + k
            end
        elseif live(v[1]) and kind == 'e' then
            while got < want do
                local f = redis.call('LPOP', jk(j, 'xq'))
                if not f then
                    break
                end
                if redis.call('HEXISTS', jk(j, 'exec'), f) == 0 and
                    redis.call('HEXISTS', jk(j, 'dead'), f) == 0 then
                    local t, s = string.match(f, '^(%d+):(%d+)$')
                    if t then
                        local att = num(redis.call('HGET', jk(j, 'att'), 'e:' .. f), 0) + 1
                        push('e', j, t, s, 1, att, redis.call('HGET', jk(j, 'tasks'), t),
                             redis.call('HGET', jk(j, 'res'), f))
                        got = got + 1
                    end
                end
            end
        end
        if got > 0 and v[1] == 'queued' then
            redis.call('HSET', jh, 'state', 'running', 'started_ms', now)
            v[1] = 'running'
        end
        local c = #counts
        local cur = num(redis.call('HGET', jh, 'cursor'), 0)
        counts[c + 1], counts[c + 2] = j, v[1] or ''
        counts[c + 3] = redis.call('LLEN', jk(j, 'retry'))
        counts[c + 4] = math.max(0, num(v[3], 0) - cur)
        counts[c + 5] = redis.call('LLEN', jk(j, 'xq'))
    end
    if #z > 0 then
        chunked('ZADD', LEASES, z, 4000)
    end
    return {units, counts}
end

------------------------------------------------------------------------------------------------
-- complete now ngroups {job kind count {task sample lease_id payload info}*count}*ngroups
--   lease_id: set on a unit's last result ('' otherwise): the lease ends with it
--   info: gen "tokens failed(0|1|2: aborted, kept|3: after a keep_partial cancel, kept)",
--         exec "correct(0|1) speedup status"
--   -> {duplicates, discarded, invalid,
--       {job done exec_added generated tokens scored correct requeued}*}
--   requeued: gen units whose last result arrived while some of their samples have no record
--   (see `incomplete` below): back on the retry list for those samples
-- Work is grouped per job: one HMGET finds records that exist already (idempotency by
-- (job, task, sample), also within the batch), one HSET writes the new ones, and one event per
-- (type, detail, term) group lists its samples, so the per-sample cost is table work in Lua
-- and a hash insert, not a command each.
local function commit_job(j, J, a, now)
    local dups, invalid = 0, 0
    local items = J.items
    -- samples per task, for the range check of tasks that override n
    local tn = nil
    if J.tn_any == '1' then
        local ts = {}
        for k = 1, #items do
            ts[k] = a[items[k]]
        end
        tn = hmget(jk(j, 'tn'), ts)
    end
    local fs, keep, kinds = {}, {}, {}
    for k = 1, #items do
        local b = items[k]
        local s = num(a[b + 1], -1)
        local n = J.n
        if tn and tn[k] then
            n = num(tn[k], J.n)
        end
        if s < 0 or s >= n then
            invalid = invalid + 1
        else
            keep[#keep + 1] = b
            kinds[#keep] = J.kinds[k]
            fs[#fs + 1] = a[b] .. ':' .. a[b + 1]
        end
    end
    if #fs == 0 then
        return dups, invalid
    end
    local dead = nil
    if J.anydead then
        dead = hmget(jk(j, 'dead'), fs)
    end
    local res = J.kind_g and hmget(jk(j, 'res'), fs) or nil
    local exe = J.kind_e and hmget(jk(j, 'exec'), fs) or nil
    local hres, hexe, groups, gorder, gerr, xerr = {}, {}, {}, {}, {}, {}
    local function add_ev(typ, d, term, f)
        local key = typ .. '\n' .. d .. '\n' .. term
        local g = groups[key]
        if not g then
            g = {typ, d, term, {}}
            groups[key] = g
            gorder[#gorder + 1] = g
        end
        g[4][#g[4] + 1] = f
    end
    local seen_g, seen_e = {}, {}
    for k = 1, #keep do
        local b, f, kind = keep[k], fs[k], kinds[k]
        local pl, info = a[b + 3], a[b + 4]
        local seen = kind == 'g' and seen_g or seen_e
        if (dead and dead[k]) or seen[f] then
            dups = dups + 1 -- dead-lettered meanwhile (its record stands) or twice in the batch
        elseif kind == 'g' then
            if res[k] then
                dups = dups + 1
            else
                seen[f] = true
                hres[#hres + 1] = f
                hres[#hres + 1] = pl
                local tok, failed = string.match(info, '^(%d+) (%d)$')
                J.gen = J.gen + 1
                J.tok = J.tok + num(tok, 0)
                if failed == '1' then
                    J.failed = J.failed + 1
                    J.term = J.term + 1
                    gerr[#gerr + 1] = f
                    gerr[#gerr + 1] = tok or '0'
                    add_ev('sample', 'error', '1', f)
                elseif failed == '2' then
                    J.term = J.term + 1 -- aborted, kept for the client to resume (not scored)
                    add_ev('sample', 'aborted', '1', f)
                elseif failed == '3' then
                    J.term = J.term + 1 -- came in after a keep_partial cancel (not scored)
                    add_ev('sample', 'cancelled', '1', f)
                elseif J.score then
                    J.xq[#J.xq + 1] = f
                    add_ev('sample', '', '0', f)
                else
                    J.term = J.term + 1
                    add_ev('sample', '', '1', f)
                end
            end
        else
            if exe[k] then
                dups = dups + 1
            else
                seen[f] = true
                hexe[#hexe + 1] = f
                hexe[#hexe + 1] = pl
                local ok, spd, st = string.match(info, '^(%d) (%S+) (%S+)$')
                J.scored = J.scored + 1
                J.term = J.term + 1
                if ok == '1' then
                    J.correct = J.correct + 1
                    J.spd = J.spd + num(spd, 0)
                end
                if st == 'EXEC_NONE' then -- no verdict: the scoring itself failed
                    xerr[#xerr + 1] = f
                    xerr[#xerr + 1] = ok or '0'
                end
                add_ev('scored', st or '', '1', f)
            end
        end
    end
    for _, h in ipairs({{'res', hres}, {'exec', hexe}, {'gerr', gerr}, {'xerr', xerr}}) do
        if #h[2] > 0 then
            chunked('HSET', jk(j, h[1]), h[2], 4000)
        end
    end
    for _, g in ipairs(gorder) do
        ev_list(j, g[1], g[4], g[2], g[3])
    end
    return dups, invalid
end

local function op_complete(a)
    local now, ng = a[2], num(a[3], 0)
    local jobs, order, z = {}, {}, {}
    local dups, discarded, invalid = 0, 0, 0
    local i = 4
    for _ = 1, ng do
        local j, kind, cnt = a[i], a[i + 1], num(a[i + 2], 0)
        i = i + 3
        local J = jobs[j]
        if not J then
            local v = redis.call('HMGET', jk(j), 'state', 'score', 'tasks', 'n', 'tn_any',
                                 'dead', 'partial')
            J = {st = v[1], score = (v[2] == '1'), tasks = num(v[3], 0), n = num(v[4], 1),
                 tn_any = v[5], anydead = num(v[6], 0) > 0, partial = v[7] == '1',
                 gen = 0, failed = 0, term = 0, tok = 0, scored = 0, correct = 0, spd = 0,
                 xq = {}, items = {}, kinds = {}, ended = {}, inbatch = {}, requeued = 0}
            jobs[j] = J
            order[#order + 1] = j
        end
        -- a job cancelled with keep_partial still records what its gen units send back
        local is_live = live(J.st) or (kind == 'g' and J.partial and J.st == 'cancelled')
        for b = i, i + 5 * (cnt - 1), 5 do
            local t = num(a[b], -1)
            if a[b + 2] ~= '' then
                z[#z + 1] = a[b + 2]
            end
            if not is_live then
                discarded = discarded + 1
            elseif t < 0 or t >= J.tasks then
                invalid = invalid + 1
            else
                local k = #J.items + 1
                J.items[k] = b
                J.kinds[k] = kind
                if kind == 'g' then
                    J.kind_g = true
                    local seen = J.inbatch[a[b]] or {}
                    seen[a[b + 1]] = true
                    J.inbatch[a[b]] = seen
                    if a[b + 2] ~= '' then
                        J.ended[#J.ended + 1] = {a[b + 2], a[b]}
                    end
                else
                    J.kind_e = true
                end
            end
        end
        i = i + 5 * cnt
    end
    -- A gen unit's last result ends its lease, but the unit's earlier results may never have
    -- been recorded: a broker killed while they waited in its memory (Redis down, or not yet
    -- committed) loses them, while the worker's later results reach the restarted broker.
    -- Found by tests/chaos (a sample lost, its job never done). So a live lease whose unit
    -- does not have all its samples in this batch is checked after the commit below, and a
    -- unit with samples still missing goes back on the retry list (which leases only them).
    local incomplete = {}
    for _, j in ipairs(order) do
        local J = jobs[j]
        for _, e in ipairs(J.ended) do
            local lid, t = e[1], e[2]
            local n = samples_of(j, t, J.n, J.tn_any)
            local have = 0
            for s in pairs(J.inbatch[t]) do
                local si = num(s, -1)
                if si >= 0 and si < n then
                    have = have + 1
                end
            end
            if have < n and redis.call('ZSCORE', LEASES, lid) then
                incomplete[#incomplete + 1] = {j, t, n}
            end
        end
    end
    if #z > 0 then
        chunked('ZREM', LEASES, z, 4000)
    end
    local out = {0, discarded, 0}
    for _, j in ipairs(order) do
        local J = jobs[j]
        if #J.items > 0 then
            local d, inv = commit_job(j, J, a, now)
            dups = dups + d
            invalid = invalid + inv
        end
    end
    for _, u in ipairs(incomplete) do
        local j, t, n = u[1], u[2], u[3]
        local fs = {}
        for s = 0, n - 1 do
            fs[#fs + 1] = t .. ':' .. s
        end
        local res, dead = hmget(jk(j, 'res'), fs), hmget(jk(j, 'dead'), fs)
        for s = 1, n do
            if not res[s] and not dead[s] then
                redis.call('RPUSH', jk(j, 'retry'), t)
                jobs[j].requeued = jobs[j].requeued + 1
                break
            end
        end
    end
    for _, j in ipairs(order) do
        local J = jobs[j]
        local jh = jk(j)
        if J.gen > 0 then
            redis.call('HINCRBY', jh, 'generated', J.gen)
            redis.call('HINCRBY', jh, 'tokens', J.tok)
        end
        if J.failed > 0 then
            redis.call('HINCRBY', jh, 'failed', J.failed)
        end
        if J.scored > 0 then
            redis.call('HINCRBY', jh, 'scored', J.scored)
            if J.correct > 0 then
                redis.call('HINCRBY', jh, 'correct', J.correct)
                redis.call('HINCRBYFLOAT', jh, 'speedup_sum', J.spd)
            end
        end
        if #J.xq > 0 then
            chunked('RPUSH', jk(j, 'xq'), J.xq, 4000)
        end
        local done = 0
        if J.term > 0 then
            redis.call('HINCRBY', jh, 'terminal', J.term)
            done = check_done(j, now)
        end
        out[#out + 1] = {j, done, #J.xq, J.gen, J.tok, J.scored, J.correct, J.requeued}
    end
    out[1], out[3] = dups, invalid
    return out
end

------------------------------------------------------------------------------------------------
-- release one lease: back to its ready queue, or dead-lettered after max_attempts.
-- penalty '1' counts a failed attempt; '0' (undeliverable, worker said goodbye) does not.
-- `fatal` dead-letters at once (the worker said the unit can never succeed).
-- Returns 'requeued', 'dead', or 'gone' (no such lease / job no longer live).
local function release_one(lid, now, penalty, fatal, err)
    if redis.call('ZREM', LEASES, lid) == 0 then
        return 'gone'
    end
    local kind, j, t, s = parse_lease(lid)
    if not kind then
        return 'gone'
    end
    local jh = jk(j)
    local v = redis.call('HMGET', jh, 'state', 'max_attempts', 'n', 'tn_any')
    if not live(v[1]) then
        return 'gone'
    end
    local key = 'g:' .. t
    if kind == 'e' then
        key = 'e:' .. t .. ':' .. s
    end
    local used
    if penalty == '1' or fatal == '1' then
        used = redis.call('HINCRBY', jk(j, 'att'), key, 1)
    else
        used = num(redis.call('HGET', jk(j, 'att'), key), 0)
    end
    if err ~= '' then
        redis.call('HSET', jk(j, 'err'), key, err)
    end
    if fatal ~= '1' and used < num(v[2], 3) then
        if kind == 'g' then
            redis.call('RPUSH', jk(j, 'retry'), t)
        else
            redis.call('RPUSH', jk(j, 'xq'), t .. ':' .. s)
        end
        return 'requeued', j, 0
    end
    -- dead-letter every sample of the unit that has no terminal record yet
    local ss = {}
    if kind == 'g' then
        local n = samples_of(j, t, num(v[3], 1), v[4])
        for i = 0, n - 1 do
            ss[#ss + 1] = tostring(i)
        end
    else
        ss[1] = s
    end
    local dead = 0
    local why = 'attempts=' .. used .. ' ' .. err
    local list = {}
    for _, si in ipairs(ss) do
        local f = t .. ':' .. si
        local done
        if kind == 'g' then
            done = redis.call('HEXISTS', jk(j, 'res'), f)
        else
            done = redis.call('HEXISTS', jk(j, 'exec'), f)
        end
        if done == 0 and redis.call('HSETNX', jk(j, 'dead'), f, why) == 1 then
            list[#list + 1] = f
            dead = dead + 1
        end
    end
    redis.call('ZADD', P .. 'deadletter', now, j .. '/' .. key)
    if dead > 0 then
        ev_list(j, 'dead', list, why, '1')
        redis.call('HINCRBY', jh, 'dead', dead)
        redis.call('HINCRBY', jh, 'terminal', dead)
        if check_done(j, now) == 1 then
            return 'dead', j, 1
        end
    end
    return 'dead', j, 0
end

-- release now penalty fatal err count lid* -> {requeued, dead, gone, {job}* (jobs with new
-- events), {job}* (jobs that became done)}
local function note_job(seen, list, j)
    if j and not seen[j] then
        seen[j] = true
        list[#list + 1] = j
    end
end

local function op_release(a)
    local now, pen, fatal, err, cnt = a[2], a[3], a[4], a[5], num(a[6], 0)
    local r = {requeued = 0, dead = 0, gone = 0}
    local touched, done, seen_t, seen_d = {}, {}, {}, {}
    for i = 1, cnt do
        local what, j, fin = release_one(a[6 + i], now, pen, fatal, err)
        r[what] = r[what] + 1
        if what == 'dead' then
            note_job(seen_t, touched, j)
        end
        if fin == 1 then
            note_job(seen_d, done, j)
        end
    end
    return {r.requeued, r.dead, r.gone, touched, done}
end

-- expire now limit -> {{lease ids released}, {job}* (new events), {job}* (became done)}
local function op_expire(a)
    local now, limit = a[2], num(a[3], 1000)
    local due = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, limit)
    local touched, done, seen_t, seen_d = {}, {}, {}, {}
    for _, lid in ipairs(due) do
        local what, j, fin = release_one(lid, now, '1', '0', 'lease expired')
        if what == 'dead' then
            note_job(seen_t, touched, j)
        end
        if fin == 1 then
            note_job(seen_d, done, j)
        end
    end
    return {due, touched, done}
end

-- renew now lease_ms lid* -> {1 when the lease exists (renewed), else 0}*
-- (ZMSCORE finds the leases that still exist, one ZADD XX moves them all)
local function op_renew(a)
    local exp = tostring(num(a[2], 0) + num(a[3], 0))
    local out, z = {}, {}
    local i = 4
    while i <= #a do
        local last = math.min(i + 3999, #a)
        local sc = redis.call('ZMSCORE', LEASES, unpack(a, i, last))
        for k = 1, last - i + 1 do
            if sc[k] then
                z[#z + 1] = exp
                z[#z + 1] = a[i + k - 1]
                out[#out + 1] = 1
            else
                out[#out + 1] = 0
            end
        end
        i = last + 1
    end
    if #z > 0 then
        local k = 1
        while k <= #z do
            local last = math.min(k + 3999, #z)
            redis.call('ZADD', LEASES, 'XX', unpack(z, k, last))
            k = last + 1
        end
    end
    return out
end

-- cancel now job keep_partial lid* -> units that will not run
-- keep_partial '1': the gen leases given stay (their units send back what they have, which
-- `complete` records: field `partial` of the job) and are not counted.
local function op_cancel(a)
    local now, j, partial = a[2], a[3], a[4] == '1'
    local jh = jk(j)
    local v = redis.call('HMGET', jh, 'state', 'tasks', 'cursor')
    if not v[1] then
        return redis.error_reply('ENOTFOUND no such job')
    end
    if not (live(v[1]) or v[1] == 'submitting') then
        return 0
    end
    local n = math.max(0, num(v[2], 0) - num(v[3], 0))
    n = n + redis.call('LLEN', jk(j, 'retry')) + redis.call('LLEN', jk(j, 'xq'))
    redis.call('DEL', jk(j, 'retry'), jk(j, 'xq'))
    for i = 5, #a do
        if not (partial and string.sub(a[i], 1, 2) == 'g.') then
            n = n + redis.call('ZREM', LEASES, a[i])
        end
    end
    if partial then
        redis.call('HSET', jh, 'partial', 1)
    end
    redis.call('HSET', jh, 'state', 'cancelled', 'finished_ms', now, 'cursor', num(v[2], 0))
    redis.call('SREM', ACTIVE, j)
    ev(j, 'cancelled', '', '', 'units=' .. n, '0')
    return n
end

-- retry now job failed_only -> units put back in their queues
-- Dead-lettered samples go back with fresh attempt counts; with failed_only also the samples
-- whose generation ended in error (anv:job:<j>:gerr) and those whose scoring gave no verdict
-- (:xerr): their records are removed and the counters taken back, so they run again. Each
-- re-queued sample gets the id of this retry's event in :redo, so that the results stream
-- skips its older, superseded terminal event.
local function op_retry(a)
    local now, j, failed_only = a[2], a[3], a[4] == '1'
    local jh = jk(j)
    local v = redis.call('HMGET', jh, 'state', 'score')
    if not v[1] then
        return redis.error_reply('ENOTFOUND no such job')
    end
    if v[1] == 'cancelled' then
        return redis.error_reply('ESTATE job is cancelled')
    end
    local gen, n, redo = {}, 0, {}
    local function requeue_gen(t)
        if not gen[t] then
            gen[t] = true
            redis.call('RPUSH', jk(j, 'retry'), t)
            redis.call('HDEL', jk(j, 'att'), 'g:' .. t)
            n = n + 1
        end
    end
    local dead = redis.call('HKEYS', jk(j, 'dead'))
    for _, f in ipairs(dead) do
        local t = string.match(f, '^(%d+):')
        if t then
            if redis.call('HEXISTS', jk(j, 'res'), f) == 1 then
                redis.call('RPUSH', jk(j, 'xq'), f)
                redis.call('HDEL', jk(j, 'att'), 'e:' .. f)
                n = n + 1
            else
                requeue_gen(t)
            end
            redo[#redo + 1] = f
        end
        redis.call('HDEL', jk(j, 'dead'), f)
    end
    local terminal = #dead
    if #dead > 0 then
        redis.call('HINCRBY', jh, 'dead', -#dead)
    end
    if failed_only then
        local ge = redis.call('HGETALL', jk(j, 'gerr'))
        local k, tok = 0, 0
        for i = 1, #ge, 2 do
            local f = ge[i]
            local t = string.match(f, '^(%d+):')
            if t and redis.call('HDEL', jk(j, 'res'), f) == 1 then
                k = k + 1
                tok = tok + num(ge[i + 1], 0)
                requeue_gen(t)
                redo[#redo + 1] = f
            end
        end
        redis.call('DEL', jk(j, 'gerr'))
        if k > 0 then
            redis.call('HINCRBY', jh, 'generated', -k)
            redis.call('HINCRBY', jh, 'failed', -k)
            redis.call('HINCRBY', jh, 'tokens', -tok)
            terminal = terminal + k
        end
        local xe = redis.call('HKEYS', jk(j, 'xerr'))
        k = 0
        for _, f in ipairs(xe) do
            if redis.call('HDEL', jk(j, 'exec'), f) == 1 then
                k = k + 1
                redis.call('RPUSH', jk(j, 'xq'), f)
                redis.call('HDEL', jk(j, 'att'), 'e:' .. f)
                n = n + 1
                redo[#redo + 1] = f
            end
        end
        redis.call('DEL', jk(j, 'xerr'))
        if k > 0 then
            redis.call('HINCRBY', jh, 'scored', -k)
            terminal = terminal + k
        end
    end
    if terminal > 0 then
        redis.call('HINCRBY', jh, 'terminal', -terminal)
        if v[1] == 'done' or v[1] == 'failed' then
            redis.call('HSET', jh, 'state', 'running')
            redis.call('HDEL', jh, 'finished_ms')
            redis.call('SADD', ACTIVE, j)
        end
        local id = ev(j, 'retry', '', '', 'units=' .. n, '0')
        local h = {}
        for _, f in ipairs(redo) do
            h[#h + 1] = f
            h[#h + 1] = id
        end
        chunked('HSET', jk(j, 'redo'), h, 4000)
    end
    return n
end

-- The samples an event is about: a list event has `ts` ("t:s,t:s,..."), a single one `t`, `s`.
local function ev_items(h)
    local out = {}
    if h.ts then
        for t, s in string.gmatch(h.ts, '(%d+):(%d+)') do
            out[#out + 1] = {t, s}
        end
    else
        out[1] = {h.t or '', h.s or ''}
    end
    return out
end

-- An offset names a place in a job's events: a stream id (after that entry), or
-- "<stream id>.<k>" (inside that entry, after its item k, counted from 0). Item k of an entry
-- of n items is at "<id>.<k>", its last one at "<id>", so resuming is exact either way.
local function item_offset(id, k, n)
    if k == n then
        return id
    end
    return id .. '.' .. (k - 1)
end

-- stream ids "ms-seq": x before y
local function id_before(x, y)
    local xm, xs = string.match(x, '^(%d+)%-(%d+)$')
    local ym, ys = string.match(y, '^(%d+)%-(%d+)$')
    if not xm or not ym then
        return false
    end
    xm, ym = tonumber(xm), tonumber(ym)
    if xm ~= ym then
        return xm < ym
    end
    return tonumber(xs) < tonumber(ys)
end

-- results job cursor page -> {next_cursor, more(0|1), {offset task sample type res exec dead}*}
-- Pages walk the job's event stream and keep its terminal events, so results come in
-- completion order, each once, and a cursor stays valid while the job keeps running.
local function op_results(a)
    local j, cursor, page = a[2], a[3], num(a[4], 100)
    local start, inside, skip = '-', nil, 0
    if cursor ~= '' and cursor ~= '0' then
        local id, k = string.match(cursor, '^(%d+%-%d+)%.(%d+)$')
        if id then
            start, inside, skip = id, id, num(k, 0) + 1
        else
            start = '(' .. cursor
        end
    end
    local items = {}
    local last = cursor
    local more = 1
    local full = false
    local retried = redis.call('EXISTS', jk(j, 'redo')) == 1
    while not full do
        local want = page - #items + 8
        local evs = redis.call('XRANGE', jk(j, 'events'), start, '+', 'COUNT', want)
        for _, e in ipairs(evs) do
            local id, f = e[1], e[2]
            local h = {}
            for k = 1, #f, 2 do
                h[f[k]] = f[k + 1]
            end
            local its = ev_items(h)
            local k0 = 1
            if id == inside then
                k0 = skip + 1
            end
            last = id
            local redo = nil
            if retried and h.term == '1' and k0 <= #its then
                local fs = {}
                for k = 1, #its do
                    fs[k] = its[k][1] .. ':' .. its[k][2]
                end
                redo = hmget(jk(j, 'redo'), fs)
            end
            if h.term == '1' then
                for k = k0, #its do
                    if not (redo and redo[k] and id_before(id, redo[k])) then
                        items[#items + 1] = {item_offset(id, k, #its), its[k][1], its[k][2],
                                             h.type}
                    end
                    if #items >= page then
                        last = item_offset(id, k, #its)
                        full = true
                        break
                    end
                end
            end
            if full then
                break
            end
        end
        if not full then
            if #evs < want then
                more = 0
                break
            end
            start, inside = '(' .. last, nil
        end
    end
    if #items > 0 then
        local fs = {}
        for k = 1, #items do
            fs[k] = items[k][2] .. ':' .. items[k][3]
        end
        local res = redis.call('HMGET', jk(j, 'res'), unpack(fs))
        local exe = redis.call('HMGET', jk(j, 'exec'), unpack(fs))
        local dead = hmget(jk(j, 'dead'), fs)
        for k = 1, #items do
            local it = items[k]
            it[5], it[6], it[7] = res[k] or '', exe[k] or '', dead[k] or ''
        end
    end
    if more == 0 then
        local st = redis.call('HGET', jk(j), 'state')
        if live(st) or st == 'submitting' then
            more = 1 -- nothing further yet, but the job is still running
        end
    end
    return {last, more, items}
end

-- load [job] -> {job fields...}* for every live job (restart), or for one job
local function op_load(a)
    local out = {}
    local ids
    if a[2] and a[2] ~= '' then
        ids = {a[2]}
    else
        ids = redis.call('SMEMBERS', ACTIVE)
    end
    for _, j in ipairs(ids) do
        local v = redis.call('HMGET', jk(j), 'state', 'priority', 'tasks', 'cursor', 'final',
                             'spec', 'created_ms', 'xkinds')
        if v[1] then
            out[#out + 1] = {j, v[1], v[2] or '0', v[3] or '0', v[4] or '0', v[5] or '0',
                             v[6] or '', redis.call('LLEN', jk(j, 'retry')),
                             redis.call('LLEN', jk(j, 'xq')), v[7] or '0', v[8] or '0'}
        elseif not a[2] or a[2] == '' then
            redis.call('SREM', ACTIVE, j)
        end
    end
    return out
end

local ops = {
    create = op_create,
    create_submit = op_create_submit,
    submit = op_submit,
    lease = op_lease,
    complete = op_complete,
    release = op_release,
    expire = op_expire,
    renew = op_renew,
    cancel = op_cancel,
    retry = op_retry,
    results = op_results,
    load = op_load,
}

local op = ops[ARGV[1]]
if not op then
    return redis.error_reply('EPROTO unknown operation ' .. tostring(ARGV[1]))
end
return op(ARGV)
