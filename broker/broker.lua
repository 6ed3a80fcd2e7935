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

------------------------------------------------------------------------------------------------
-- create now job_id idem_key spec name priority n score max_attempts tenant
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
    redis.call('ZADD', P .. 'jobs', now, j)
    redis.call('SADD', ACTIVE, j)
    if idem ~= '' then
        redis.call('SET', P .. 'idem:' .. idem, j)
    end
    return {j, 0}
end

-- submit now job final count chunk_key {custom_id task_bytes n}*count
--   -> {accepted, skipped, tasks}
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
    local v = redis.call('HMGET', jh, 'state', 'tasks', 'samples_total', 'n', 'final')
    if not v[1] then
        return redis.error_reply('ENOTFOUND no such job')
    end
    local state = v[1]
    if state == 'cancelled' or state == 'failed' then
        return redis.error_reply('ESTATE job is ' .. state)
    end
    -- a job that is final takes no new tasks; re-submitting ones it has is fine (skipped)
    if v[5] == '1' then
        for i = 0, cnt - 1 do
            local cid = a[7 + 3 * i]
            if cid == '' or redis.call('HEXISTS', jk(j, 'cid'), cid) == 0 then
                return redis.error_reply('ESTATE job is final and takes no new tasks')
            end
        end
        return {0, cnt, num(v[2], 0)}
    end
    local idx, tot, n = num(v[2], 0), num(v[3], 0), num(v[4], 1)
    local acc, skip = 0, 0
    local hs, tn = {}, {}
    for i = 0, cnt - 1 do
        local cid, body, tnv = a[7 + 3 * i], a[8 + 3 * i], num(a[9 + 3 * i], 0)
        if cid ~= '' and redis.call('HSETNX', jk(j, 'cid'), cid, idx) == 0 then
            skip = skip + 1
        else
            hs[#hs + 1] = idx
            hs[#hs + 1] = body
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
    redis.call('HSET', jh, 'tasks', idx, 'samples_total', tot, 'state', state)
    if final == '1' then
        redis.call('HSET', jh, 'final', 1)
    end
    ev(j, 'submitted', '', '', 'accepted=' .. acc .. ' skipped=' .. skip, '0')
    if ck ~= '' then
        redis.call('HSET', jk(j, 'chunks'), ck, acc .. ' ' .. skip .. ' ' .. idx)
    end
    if final == '1' then
        check_done(j, now)
    end
    return {acc, skip, idx}
end

------------------------------------------------------------------------------------------------
-- lease now lease_ms ngroups {job kind(g|e) count}*ngroups
--   -> {units, counts}
--   units: 9 strings per unit: kind job lease_id task samples(csv, '' = all) n attempt
--          task_bytes sample_bytes
--   counts: 5 per group: job state retry_len fresh_left exec_len
local function op_lease(a)
    local now, exp = num(a[2], 0), num(a[2], 0) + num(a[3], 0)
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
        z[#z + 1] = exp
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
                local bodies = redis.call('HMGET', jk(j, 'tasks'), unpack(fields))
                local ns = nil
                if v[5] == '1' then
                    ns = redis.call('HMGET', jk(j, 'tn'), unpack(fields))
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
-- complete now count {kind job task sample lease_id last payload info}*count
--   info: gen "tokens failed(0|1|2: aborted, kept)", exec "correct(0|1) speedup"
--   -> {duplicates, discarded, invalid, {job done exec_added}*}
local function op_complete(a)
    local now, cnt = a[2], num(a[3], 0)
    local jobs, order, z = {}, {}, {}
    local dups, discarded, invalid = 0, 0, 0
    for i = 0, cnt - 1 do
        local b = 4 + 8 * i
        local kind, j, t, s, lid, last, pl, info = a[b], a[b + 1], a[b + 2], a[b + 3], a[b + 4],
            a[b + 5], a[b + 6], a[b + 7]
        local J = jobs[j]
        if not J then
            local v = redis.call('HMGET', jk(j), 'state', 'score', 'tasks', 'n', 'tn_any',
                                 'dead')
            J = {st = v[1], score = (v[2] == '1'), tasks = num(v[3], 0), n = num(v[4], 1),
                 tn_any = v[5], anydead = num(v[6], 0) > 0, gen = 0, failed = 0, term = 0, tok = 0, scored = 0,
                 correct = 0, spd = 0, xq = {}}
            jobs[j] = J
            order[#order + 1] = j
        end
        if last == '1' then
            z[#z + 1] = lid
        end
        local f = t .. ':' .. s
        if not live(J.st) then
            discarded = discarded + 1
        elseif num(t, -1) < 0 or num(t, -1) >= J.tasks or num(s, -1) < 0 or
            num(s, -1) >= samples_of(j, t, J.n, J.tn_any) then
            invalid = invalid + 1
        elseif J.anydead and redis.call('HEXISTS', jk(j, 'dead'), f) == 1 then
            dups = dups + 1 -- dead-lettered meanwhile: its record stands
        elseif kind == 'g' then
            if redis.call('HSETNX', jk(j, 'res'), f, pl) == 1 then
                local tok, failed = string.match(info, '^(%d+) (%d)$')
                J.gen = J.gen + 1
                J.tok = J.tok + num(tok, 0)
                if failed == '1' then
                    J.failed = J.failed + 1
                    J.term = J.term + 1
                    ev(j, 'sample', t, s, 'error', '1')
                elseif failed == '2' then
                    J.term = J.term + 1 -- aborted, kept for the client to resume
                    ev(j, 'sample', t, s, 'aborted', '1')
                elseif J.score then
                    J.xq[#J.xq + 1] = f
                    ev(j, 'sample', t, s, '', '0')
                else
                    J.term = J.term + 1
                    ev(j, 'sample', t, s, '', '1')
                end
            else
                dups = dups + 1
            end
        else
            if redis.call('HSETNX', jk(j, 'exec'), f, pl) == 1 then
                local ok, spd, st = string.match(info, '^(%d) (%S+) (%S+)$')
                J.scored = J.scored + 1
                J.term = J.term + 1
                if ok == '1' then
                    J.correct = J.correct + 1
                    J.spd = J.spd + num(spd, 0)
                end
                ev(j, 'scored', t, s, st or '', '1')
            else
                dups = dups + 1
            end
        end
    end
    if #z > 0 then
        chunked('ZREM', LEASES, z, 4000)
    end
    local out = {dups, discarded, invalid}
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
        out[#out + 1] = {j, done, #J.xq}
    end
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
        return 'requeued'
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
    for _, si in ipairs(ss) do
        local f = t .. ':' .. si
        local done
        if kind == 'g' then
            done = redis.call('HEXISTS', jk(j, 'res'), f)
        else
            done = redis.call('HEXISTS', jk(j, 'exec'), f)
        end
        if done == 0 and redis.call('HSETNX', jk(j, 'dead'), f, why) == 1 then
            ev(j, 'dead', t, si, why, '1')
            dead = dead + 1
        end
    end
    redis.call('ZADD', P .. 'deadletter', now, j .. '/' .. key)
    if dead > 0 then
        redis.call('HINCRBY', jh, 'dead', dead)
        redis.call('HINCRBY', jh, 'terminal', dead)
        check_done(j, now)
    end
    return 'dead'
end

-- release now penalty fatal err count lid* -> {requeued, dead, gone}
local function op_release(a)
    local now, pen, fatal, err, cnt = a[2], a[3], a[4], a[5], num(a[6], 0)
    local r = {requeued = 0, dead = 0, gone = 0}
    for i = 1, cnt do
        local what = release_one(a[6 + i], now, pen, fatal, err)
        r[what] = r[what] + 1
    end
    return {r.requeued, r.dead, r.gone}
end

-- expire now limit -> {lease ids released}
local function op_expire(a)
    local now, limit = a[2], num(a[3], 1000)
    local due = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, limit)
    for _, lid in ipairs(due) do
        release_one(lid, now, '1', '0', 'lease expired')
    end
    return due
end

-- renew now lease_ms lid* -> {1 when the lease exists (renewed), else 0}*
local function op_renew(a)
    local exp = num(a[2], 0) + num(a[3], 0)
    local out = {}
    for i = 4, #a do
        if redis.call('ZSCORE', LEASES, a[i]) then
            redis.call('ZADD', LEASES, exp, a[i])
            out[#out + 1] = 1
        else
            out[#out + 1] = 0
        end
    end
    return out
end

-- cancel now job lid* -> units that will not run
local function op_cancel(a)
    local now, j = a[2], a[3]
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
    for i = 4, #a do
        n = n + redis.call('ZREM', LEASES, a[i])
    end
    redis.call('HSET', jh, 'state', 'cancelled', 'finished_ms', now, 'cursor', num(v[2], 0))
    redis.call('SREM', ACTIVE, j)
    ev(j, 'cancelled', '', '', 'units=' .. n, '0')
    return n
end

-- retry now job -> dead-lettered units put back in their queues
local function op_retry(a)
    local now, j = a[2], a[3]
    local jh = jk(j)
    local v = redis.call('HMGET', jh, 'state', 'score')
    if not v[1] then
        return redis.error_reply('ENOTFOUND no such job')
    end
    if v[1] == 'cancelled' then
        return redis.error_reply('ESTATE job is cancelled')
    end
    local dead = redis.call('HKEYS', jk(j, 'dead'))
    local gen, n = {}, 0
    for _, f in ipairs(dead) do
        local t = string.match(f, '^(%d+):')
        if t then
            if redis.call('HEXISTS', jk(j, 'res'), f) == 1 then
                redis.call('RPUSH', jk(j, 'xq'), f)
                redis.call('HDEL', jk(j, 'att'), 'e:' .. f)
                n = n + 1
            elseif not gen[t] then
                gen[t] = true
                redis.call('RPUSH', jk(j, 'retry'), t)
                redis.call('HDEL', jk(j, 'att'), 'g:' .. t)
                n = n + 1
            end
        end
        redis.call('HDEL', jk(j, 'dead'), f)
    end
    if #dead > 0 then
        redis.call('HINCRBY', jh, 'dead', -#dead)
        redis.call('HINCRBY', jh, 'terminal', -#dead)
        if v[1] == 'done' or v[1] == 'failed' then
            redis.call('HSET', jh, 'state', 'running')
            redis.call('HDEL', jh, 'finished_ms')
            redis.call('SADD', ACTIVE, j)
        end
        ev(j, 'retry', '', '', 'units=' .. n, '0')
    end
    return n
end

-- results job cursor page -> {next_cursor, more(0|1), {event_id task sample type res exec dead}*}
-- Pages walk the job's event stream and keep its terminal events, so results come in
-- completion order, each once, and a cursor stays valid while the job keeps running.
local function op_results(a)
    local j, cursor, page = a[2], a[3], num(a[4], 100)
    local start = '-'
    if cursor ~= '' then
        start = '(' .. cursor
    end
    local items = {}
    local last = cursor
    local more = 1
    while #items < page do
        local want = (page - #items) * 2 + 8
        local evs = redis.call('XRANGE', jk(j, 'events'), start, '+', 'COUNT', want)
        for _, e in ipairs(evs) do
            local id, f = e[1], e[2]
            local h = {}
            for k = 1, #f, 2 do
                h[f[k]] = f[k + 1]
            end
            last = id
            if h.term == '1' then
                local key = h.t .. ':' .. h.s
                items[#items + 1] = {id, h.t, h.s, h.type,
                                     redis.call('HGET', jk(j, 'res'), key) or '',
                                     redis.call('HGET', jk(j, 'exec'), key) or '',
                                     redis.call('HGET', jk(j, 'dead'), key) or ''}
                if #items >= page then
                    break
                end
            end
        end
        if #items >= page then
            break
        end
        if #evs < want then
            more = 0
            break
        end
        start = '(' .. last
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
                             'spec', 'created_ms')
        if v[1] then
            out[#out + 1] = {j, v[1], v[2] or '0', v[3] or '0', v[4] or '0', v[5] or '0',
                             v[6] or '', redis.call('LLEN', jk(j, 'retry')),
                             redis.call('LLEN', jk(j, 'xq')), v[7] or '0'}
        elseif not a[2] or a[2] == '' then
            redis.call('SREM', ACTIVE, j)
        end
    end
    return out
end

local ops = {
    create = op_create,
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
