"""The server-side Lua scripts of the Redis backend (ringq/redis/queue.py): one per transition.

Each script runs atomically on the server, so a transition (enqueue, lease, ack, nack, extend,
expiry, requeue, purge) is all-or-nothing and never interleaves with another.  Every key a script
touches is passed in ``KEYS`` and shares the hash tag ``{ringq:<name>}``, so on Redis Cluster all
of one queue lives in one hash slot.  Time is the server's (``TIME``): lease deadlines and delays
are compared on one clock whatever the clients' clocks say.

Keys (``KEYS[1..20]``)::

    ready    ZSET, score 0: due jobs; the member is ``<-priority: 10 digits><TURN_BASE + turn:
             15><seq: 16>`` followed by the job id, so ZRANGE 0 n-1 is the lease order.  The
             turn is fair scheduling across keys: each job takes the next turn of its key (jobs
             without a key share one), at least the priority's current round, so keys take
             turns one lease each (round-robin), FIFO within a key, and a key that was idle
             starts at the round.  An older ringq wrote the available-at (ms, below TURN_BASE)
             where the turn is: such a member sorts before the new ones of its priority, and
             both forms have the id at byte 42, where every version reads it
    delayed  ZSET: READY jobs not yet due, scored by available_at (ms)
    leased   ZSET: leased jobs scored by lease deadline (ms)
    dead     ZSET: dead-lettered jobs scored by seq
    done     ZSET: finished jobs scored by finish time (ms), trimmed after the retention
    all      ZSET: every retained job scored by seq (enqueue order, for list_jobs)
    meta     HASH: id -> JSON of the job's fields (state, attempts, token, times, last error)
    payload  HASH: id -> one codec byte + the encoded payload
    wake     LIST: wake-up tokens for consumers blocked in BLPOP
    seq      STRING: the enqueue counter (auto ids are its 16 hex digits)
    pause    STRING: "1" while the whole queue is paused (leases return nothing)
    cancelled ZSET: cancelled jobs scored by finish time (ms), trimmed like ``done``
    expired  ZSET: jobs that expired before anyone leased them, scored by finish time (ms)
    counts   HASH: cumulative counters since creation, never lowered (purge keeps them):
             enqueued (new jobs stored by enqueue; imports and requeues not counted), acked,
             dead (moves to the dead-letter queue by nack or lease expiry)
    deferred ZSET: DEFERRED jobs (waiting for their parents) scored by seq
    edges    ZSET, score 0: the pending edges, member ``<8 hex: length of parent id><parent id>
             <child id>``, so a parent's dependents are one ZRANGEBYLEX from its prefix
    fair     HASH: ``v<priority>``: the round of that priority (the turn of the job leased
             last); ``t<priority>:<key>``: the next turn of that key
    next     HASH: id -> codec byte + payload of the job's next run (a debounce or replace of
             a leased job: it takes the job's place when the current run ends)
    pending  HASH: id -> 2 * (how many of a DEFERRED job's parents have not finished) + af,
             so a parent's end reads or lowers one field (HGET, HINCRBY -2), never the job
    links    ZSET, score 0: every edge of a retained dependent, fired or not (as ``edges``),
             for ``dependents()``

Job fields in ``meta``: id, p (priority), s (seq), st (ready/leased/done/dead), a (attempts),
m (max attempts), av (available at, ms), enq (enqueued at, ms), dl (lease deadline, ms),
t (fencing token: leases so far), why ("expired" when the last lease ran out), e (last error),
rk (the job's member in ``ready``), fin (finish time, ms), cx (1: cancel requested while leased),
ex (expires-at, ms: never leased after it), pg / pm (progress fraction / message of the current lease),
to (hard timeout of one attempt, ms), tp / ts (W3C traceparent / tracestate of the enqueue),
fa (traceparent of the first attempt's span, recorded by a Worker for a retry's link),
k (the job's key), g (its turn, while ready), dp (ids of the jobs it depends on), af (1:
allow_failure), nx (the fields of its next run, while one waits: see ``next`` and ENQUEUE).
States (st): ready, leased, done, dead, cancelled, expired, deferred.

A job that ends (done, dead, cancelled, expired) fires its pending edges in the same script
(``fire``): each dependent's count goes down by one, O(1) per edge (the dependent's record,
with its list of parents, is read only when it is released or cancelled).  The parent that
brings the count to 0 makes it ready, so it is released exactly once, by the script that
finished its last parent; a failed parent cancels a dependent without ``af`` (and its
dependents in turn), with an error naming that parent.
"""

PRELUDE = r"""
local K_READY, K_DELAYED, K_LEASED, K_DEAD, K_DONE, K_ALL, K_META, K_PAY, K_WAKE, K_SEQ =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local K_PAUSE, K_CANCELLED, K_EXPIRED = KEYS[11], KEYS[12], KEYS[13]
local K_CNT = KEYS[14]
local K_DEFERRED, K_EDGES, K_FAIR, K_NEXT, K_PENDING, K_LINKS =
  KEYS[15], KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20]
local T = redis.call('TIME')
local now = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)
local WAKE_CAP = 256
local TURN_BASE = 100000000000000  -- 10^14 ms is the year 5138: above every available-at

local function load(id)
  local r = redis.call('HGET', K_META, id)
  if not r then return nil end
  return cjson.decode(r)
end
local function save(m)
  local s = cjson.encode(m)
  redis.call('HSET', K_META, m.id, s)
  return s
end
local function wake(n)
  if n <= 0 then return end
  if n > WAKE_CAP then n = WAKE_CAP end
  for _ = 1, n do redis.call('RPUSH', K_WAKE, 1) end
  redis.call('LTRIM', K_WAKE, -WAKE_CAP, -1)
end
-- READY: into 'ready' if due (returns true), else into 'delayed'.  A due job takes turn g if
-- given (it keeps its place), else its key's next turn (fair scheduling: the module's docstring).
local function make_ready(m, g)
  m.st = 'ready'
  m.dl = nil
  if m.av <= now then
    if g == nil then
      local tf = 't' .. m.p .. ':' .. (m.k or '')
      local f = redis.call('HMGET', K_FAIR, 'v' .. m.p, tf)
      g = math.max(tonumber(f[1] or '0'), tonumber(f[2] or '0'))
      redis.call('HSET', K_FAIR, tf, g + 1)
    end
    m.g = g
    m.rk = string.format('%010d%015d%016d', 2147483647 - m.p, TURN_BASE + g, m.s) .. m.id
    redis.call('ZADD', K_READY, 0, m.rk)
    return true
  end
  m.rk = nil
  m.g = nil
  redis.call('ZADD', K_DELAYED, m.av, m.id)
  return false
end
-- The id in a member of 'ready' (either form).
local function member_id(member)
  return string.sub(member, 42)
end
-- A job leased at its turn: the round of its priority moves there; its key's next turn is
-- forgotten once nothing of the key waits behind it.
local function served(m)
  if m.g == nil then return end
  local vf = 'v' .. m.p
  if tonumber(redis.call('HGET', K_FAIR, vf) or '0') < m.g then redis.call('HSET', K_FAIR, vf, m.g) end
  local tf = 't' .. m.p .. ':' .. (m.k or '')
  if tonumber(redis.call('HGET', K_FAIR, tf) or '0') <= m.g + 1 then redis.call('HDEL', K_FAIR, tf) end
  m.g = nil
end
local function edge(parent, child)
  return string.format('%08x', #parent) .. parent .. child
end
-- The ids of the dependents with an edge from parent in zset k (edges or links): one range of
-- the members that start with the parent's prefix (ids are UTF-8, never byte 255).
local function children(k, parent)
  local pre = string.format('%08x', #parent) .. parent
  local out, start = {}, 0
  while true do
    local got = redis.call('ZRANGEBYLEX', k, '[' .. pre, '(' .. pre .. '\255', 'LIMIT', start, 500)
    for _, e in ipairs(got) do out[#out + 1] = string.sub(e, #pre + 1) end
    if #got < 500 then return out end
    start = start + #got
  end
end
local function make_dead(m)
  m.st = 'dead'
  m.dl = nil
  m.rk = nil
  m.g = nil
  m.fin = now
  redis.call('ZADD', K_DEAD, m.s, m.id)
end
-- A job that ends without completing: cancelled, or expired before it was leased.
local function make_ended(m, st)
  m.st = st
  m.dl = nil
  m.rk = nil
  m.g = nil
  m.cx = nil
  m.fin = now
  redis.call('ZADD', st == 'expired' and K_EXPIRED or K_CANCELLED, now, m.id)
end
-- Take m out of the set of its state (before it is placed anew); its links too unless keep.
local function unplace(m, keep)
  if m.st == 'ready' then
    if m.rk then redis.call('ZREM', K_READY, m.rk) else redis.call('ZREM', K_DELAYED, m.id) end
  elseif m.st == 'deferred' then
    redis.call('ZREM', K_DEFERRED, m.id)
    redis.call('HDEL', K_PENDING, m.id)
    for _, p in ipairs(m.dp or {}) do redis.call('ZREM', K_EDGES, edge(p, m.id)) end
  elseif m.st == 'leased' then redis.call('ZREM', K_LEASED, m.id)
  elseif m.st == 'dead' then redis.call('ZREM', K_DEAD, m.id)
  elseif m.st == 'done' then redis.call('ZREM', K_DONE, m.id)
  elseif m.st == 'cancelled' then redis.call('ZREM', K_CANCELLED, m.id)
  elseif m.st == 'expired' then redis.call('ZREM', K_EXPIRED, m.id)
  end
  if not keep then
    for _, p in ipairs(m.dp or {}) do redis.call('ZREM', K_LINKS, edge(p, m.id)) end
  end
  m.rk = nil
  m.g = nil
end
-- How a parent's state counts for its dependents: 'ok' (done), 'failed' (dead, cancelled,
-- expired), or nil (not finished).
local function outcome(st)
  if st == 'done' then return 'ok' end
  if st == 'dead' or st == 'cancelled' or st == 'expired' then return 'failed' end
  return nil
end
local ended_as = {dead = 'dead-lettered', cancelled = 'cancelled', expired = 'expired'}
local function cancel_for(m, parent, st)
  make_ended(m, 'cancelled')
  m.e = "parent job '" .. parent .. "' ended " .. ended_as[st]
end
-- Place m with its parents (m.dp, m.af): DEFERRED while some have not finished (an edge from
-- each, and 2 * their count + af in 'pending'), CANCELLED if one failed and not af, else
-- READY.  A parent not retained counts as done.  Returns true if m is due now.
local function place(m)
  if not m.dp then return make_ready(m) end
  local pending, failed = 0, nil
  for _, p in ipairs(m.dp) do
    redis.call('ZADD', K_LINKS, 0, edge(p, m.id))
    if not failed then
      local pm = load(p)
      local how = pm and outcome(pm.st)
      if how == 'failed' and not m.af then
        failed = pm
      elseif pm and not how then
        pending = pending + 1
        redis.call('ZADD', K_EDGES, 0, edge(p, m.id))
      end
    end
  end
  if failed then
    for _, p in ipairs(m.dp) do redis.call('ZREM', K_EDGES, edge(p, m.id)) end
    cancel_for(m, failed.id, failed.st)
    return false
  end
  if pending == 0 then return make_ready(m) end
  m.st = 'deferred'
  m.rk = nil
  m.g = nil
  redis.call('HSET', K_PENDING, m.id, 2 * pending + (m.af or 0))
  redis.call('ZADD', K_DEFERRED, m.s, m.id)
  return false
end
-- m just ended in state m.st: fire its pending edges, one HGET/HINCRBY per dependent.  The
-- dependent whose last parent this was becomes ready; a failed parent cancels a dependent
-- without af, whose own edges fire in turn.  Returns how many jobs became due.
local function fire(m)
  local todo, woken = {m}, 0
  while #todo > 0 do
    local cur = table.remove(todo)
    local failed = outcome(cur.st) == 'failed'
    for _, c in ipairs(children(K_EDGES, cur.id)) do
      redis.call('ZREM', K_EDGES, edge(cur.id, c))
      local v = tonumber(redis.call('HGET', K_PENDING, c) or '-1')
      if v >= 0 then
        if failed and v % 2 == 0 then
          local cm = load(c)
          unplace(cm, true)
          cancel_for(cm, cur.id, cur.st)
          save(cm)
          todo[#todo + 1] = cm
        elseif v < 4 then  -- this was its last parent
          local cm = load(c)
          redis.call('HDEL', K_PENDING, c)
          redis.call('ZREM', K_DEFERRED, c)
          if make_ready(cm) then woken = woken + 1 end
          save(cm)
        else
          redis.call('HINCRBY', K_PENDING, c, -2)
        end
      end
    end
  end
  return woken
end
-- Give m the fields of run f (a table of enqueue's arguments: see ENQUEUE) and place it.
-- Returns how many jobs became due (m, or dependents a cancel of m released).
local function start_run(m, f)
  m.p, m.m, m.a, m.s, m.enq, m.av = f.p, f.m, 0, f.s, f.enq, f.at
  m.ex, m.to, m.tp, m.ts, m.k, m.dp, m.af = f.ex, f.to, f.tp, f.ts, f.k, f.dp, f.af
  redis.call('ZADD', K_ALL, m.s, m.id)
  if place(m) then return 1 end
  if outcome(m.st) then return fire(m) end
  return 0
end
-- Replace job m (any state but leased) by run f, whose payload is already stored.
local function rerun(m, f)
  unplace(m, false)
  for _, x in ipairs({'nx', 'why', 'e', 'fin', 'cx', 'pg', 'pm', 'fa', 'dl'}) do m[x] = nil end
  return start_run(m, f)
end
-- The run of m ended (state m.st), or is about to be retried: a finished m fires its edges;
-- then, if a next run waits (nx, see ENQUEUE), it takes the job's place -- its payload and
-- fields, attempts from 0, fencing tokens going on.  Returns how many jobs became due.
local function ended(m)
  local woken = 0
  if outcome(m.st) then woken = fire(m) end
  if not m.nx then return woken end
  local f = m.nx
  redis.call('HSET', K_PAY, m.id, redis.call('HGET', K_NEXT, m.id))
  redis.call('HDEL', K_NEXT, m.id)
  return woken + rerun(m, f)
end
-- Delayed jobs that came due become ready; expired leases return (or dead-letter).
local function promote()
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, 1000)
  for _, id in ipairs(due) do
    redis.call('ZREM', K_DELAYED, id)
    local m = load(id)
    if m then make_ready(m); save(m) end
  end
  local exp = redis.call('ZRANGEBYSCORE', K_LEASED, '-inf', '(' .. now, 'LIMIT', 0, 1000)
  for _, id in ipairs(exp) do
    redis.call('ZREM', K_LEASED, id)
    local m = load(id)
    if m then
      m.why = 'expired'
      if m.cx then
        make_ended(m, 'cancelled')
        m.rc = 1  -- ended by this reclaim, unacked: its holder's ack is refused, not a repeat
      elseif m.a >= m.m then
        make_dead(m)
        redis.call('HINCRBY', K_CNT, 'dead', 1)
      elseif not m.nx then  -- a next run waiting takes the retry's place
        m.av = now; make_ready(m)
      end
      wake(ended(m))
      save(m)
    end
  end
end
-- The state promote() gives a lease that ran out: cancelled (a cancel was asked), dead (its
-- attempts are used up) or ready.
local function reclaimed_state(m)
  if m.cx then return 'cancelled' end
  if m.a >= m.m then return 'dead' end
  return 'ready'
end
-- 'ok', or why the caller does not hold the lease of m with token tok (-1: any token).  A lease
-- that ran out is refused though no lease call reclaimed it yet, as what promote() makes it.
local function check_lease(m, tok)
  if not m then return 'nf' end
  if m.st ~= 'leased' then return 'nl:' .. m.st .. ':' .. (m.why or '') .. ':' .. (m.t or 0) end
  if m.dl < now then return 'nl:' .. reclaimed_state(m) .. ':expired:' .. m.t end
  if tok >= 0 and m.t ~= tok then return 'stale:' .. m.t end
  return 'ok'
end
-- A job's meta JSON as the reads (get, list) show it, and its state: a lease that ran out and
-- that no lease call has reclaimed yet reads as what promote() will make it.  Writes nothing.
local function as_read(r)
  if not r then return r, nil end
  local m = cjson.decode(r)
  if m.st ~= 'leased' or m.dl >= now then return r, m.st end
  m.why = 'expired'
  m.dl = nil
  m.st = reclaimed_state(m)
  if m.st == 'ready' then m.av = now else m.cx, m.fin = nil, now end
  return cjson.encode(m), m.st
end
local function forget(id)
  local m = load(id)
  if m then for _, p in ipairs(m.dp or {}) do redis.call('ZREM', K_LINKS, edge(p, id)) end end
  redis.call('HDEL', K_META, id)
  redis.call('HDEL', K_PAY, id)
  redis.call('HDEL', K_NEXT, id)
  redis.call('ZREM', K_ALL, id)
  redis.call('ZREM', K_DONE, id)
  redis.call('ZREM', K_CANCELLED, id)
  redis.call('ZREM', K_EXPIRED, id)
end
local function trim(keep)
  for _, k in ipairs({K_DONE, K_CANCELLED, K_EXPIRED}) do
    local old = redis.call('ZRANGEBYSCORE', k, '-inf', now - keep, 'LIMIT', 0, 100)
    for _, id in ipairs(old) do forget(id) end
  end
end
"""

# ARGV: priority, delay_ms, max_attempts, n, then n pairs (id or "", codec byte + payload), then
# expires-at ms (0: none), timeout ms (0: none), traceparent and tracestate ("": none), key ("":
# none), mode ("r": replace the job with that id, "": keep a retained one), allow_failure "0"/"1",
# np, then np parent ids (with n = 1).  A parent not retained: {{"nf", id}}, or one that waits for
# the job it would replace: {{"cycle", id}}, and nothing written.
# Returns per job {"new"|"old", meta JSON, payload or false (for new jobs the caller has it)}.
#
# Replacing job k: a waiting or finished k takes the new run at once (a new seq, so it queues
# behind what came before); a leased k keeps running and the new run waits in its ``nx`` field
# (its payload in ``next``), replacing a next run already waiting, until the run ends (ended()).
ENQUEUE = r"""
local prio, delay, maxatt, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local b = 4 + 2 * n
local ex = tonumber(ARGV[b + 1] or '0')
local to, tp, ts = tonumber(ARGV[b + 2] or '0'), ARGV[b + 3] or '', ARGV[b + 4] or ''
local key, mode, af = ARGV[b + 5] or '', ARGV[b + 6] or '', ARGV[b + 7] == '1'
local np = tonumber(ARGV[b + 8] or '0')
local dp = nil
if np > 0 then
  dp = {}
  for j = 1, np do dp[j] = ARGV[b + 8 + j] end
  local id = ARGV[5]
  if mode == 'r' or id == '' or redis.call('HEXISTS', K_META, id) == 0 then
    for _, p in ipairs(dp) do
      if redis.call('HEXISTS', K_META, p) == 0 then return {{'nf', p}} end
    end
  end
  if mode == 'r' and id ~= '' then
    -- a replacement must not wait for a job that waits for it: no parent among its dependents
    local want, seen, todo = {}, {[id] = true}, {id}
    for _, p in ipairs(dp) do want[p] = true end
    while #todo > 0 do
      for _, c in ipairs(children(K_EDGES, table.remove(todo))) do
        if want[c] then return {{'cycle', c}} end
        if not seen[c] then seen[c] = true; todo[#todo + 1] = c end
      end
    end
  end
end
local out, due, added = {}, 0, 0
for i = 1, n do
  local id, pay = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local old = nil
  if id ~= '' then old = load(id) end
  if old and mode ~= 'r' then
    out[i] = {'old', redis.call('HGET', K_META, id), redis.call('HGET', K_PAY, id)}
  else
    local s = redis.call('INCR', K_SEQ)
    if id == '' then
      id = string.format('%016x', s)
      while redis.call('HEXISTS', K_META, id) == 1 do
        s = redis.call('INCR', K_SEQ)
        id = string.format('%016x', s)
      end
    end
    local f = {p = prio, m = maxatt, s = s, enq = now, at = now + delay}
    if ex > 0 then f.ex = ex end
    if to > 0 then f.to = to end
    if tp ~= '' then f.tp = tp end
    if ts ~= '' then f.ts = ts end
    if key ~= '' then f.k = key end
    if dp then f.dp = dp end
    if af then f.af = 1 end
    if old and old.st == 'leased' then
      old.nx = f
      redis.call('HSET', K_NEXT, id, pay)
      save(old)
      -- the reply shows the next run, waiting for the current one
      local v = {id = id, st = 'deferred', t = 0}
      for k2, x in pairs(f) do v[k2] = x end
      v.av, v.a, v.at = f.at, 0, nil
      out[i] = {'new', cjson.encode(v), false}
    else
      redis.call('HSET', K_PAY, id, pay)
      if old then
        due = due + rerun(old, f)
      else
        old = {id = id, t = 0}
        due = due + start_run(old, f)
      end
      out[i] = {'new', save(old), false}
    end
    added = added + 1
  end
end
if added > 0 then redis.call('HINCRBY', K_CNT, 'enqueued', added) end
-- a delayed job wakes one sleeper too, so that it recomputes how long to sleep
if due == 0 and n > 0 then due = 1 end
wake(due)
return out
"""

# ARGV: count, visibility timeout ms.  Returns {ms until the next delayed job or lease deadline
# (-1: none), meta1, payload1, meta2, payload2, ...}.
LEASE = r"""
promote()
local count, vt = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {-1}
if redis.call('GET', K_PAUSE) == '1' then return out end
local taken = 0
while taken < count do
  local members = redis.call('ZRANGE', K_READY, 0, count - taken - 1)
  if #members == 0 then break end
  for _, member in ipairs(members) do
    redis.call('ZREM', K_READY, member)
    local m = load(member_id(member))
    if m and m.ex and m.t == 0 and m.ex < now then
      make_ended(m, 'expired')  -- never leased before its expiry: it never runs
      wake(ended(m))
      save(m)
    elseif m then
      served(m)
      m.st = 'leased'
      m.rk = nil
      m.t = m.t + 1
      m.a = m.a + 1
      m.dl = now + vt
      m.pg = nil
      m.pm = nil
      m.rc = nil
      redis.call('ZADD', K_LEASED, m.dl, m.id)
      out[#out + 1] = save(m)
      out[#out + 1] = redis.call('HGET', K_PAY, m.id)
      taken = taken + 1
    end
  end
end
-- pass the wake-up on while due jobs remain, so other sleepers take them
if taken == count and redis.call('ZCARD', K_READY) > 0 and redis.call('LLEN', K_WAKE) == 0 then wake(1) end
local nxt = nil
for _, k in ipairs({K_DELAYED, K_LEASED}) do
  local first = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if first[2] then
    local d = tonumber(first[2]) - now
    if nxt == nil or d < nxt then nxt = d end
  end
end
if nxt ~= nil then out[1] = math.max(0, nxt) end
return out
"""

# ARGV: done retention ms, n, then n pairs (id, token or -1).  Returns one status per job.
ACK = r"""
local keep, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 1, n do
  local id, tok = ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i])
  local m = load(id)
  if m and (m.st == 'done' or m.st == 'cancelled' or m.st == 'expired')
      and (tok < 0 or (m.t == tok and not m.rc)) then
    out[i] = 'ok'
  else
    local st = check_lease(m, tok)
    if st == 'ok' then
      redis.call('ZREM', K_LEASED, id)
      if m.cx then
        make_ended(m, 'cancelled')  -- the ack of a cancel-requested lease
      else
        m.st = 'done'
        m.dl = nil
        m.fin = now
        redis.call('ZADD', K_DONE, now, id)
      end
      wake(ended(m))
      save(m)
      redis.call('HINCRBY', K_CNT, 'acked', 1)
    end
    out[i] = st
  end
end
trim(keep)
return out
"""

# ARGV: id, token or -1, error text, has_error 0/1, delay ms.  Returns {status, meta, payload}.
NACK = r"""
local id, tok, delay = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local m = load(id)
local st = check_lease(m, tok)
if st ~= 'ok' then return {st} end
redis.call('ZREM', K_LEASED, id)
if ARGV[4] == '1' then m.e = ARGV[3] end
m.why = nil
if m.cx then
  make_ended(m, 'cancelled')  -- a cancel-requested lease is never retried
elseif m.a >= m.m then
  make_dead(m)
  redis.call('HINCRBY', K_CNT, 'dead', 1)
elseif not m.nx then  -- a next run waiting takes the retry's place
  m.av = now + delay
  if make_ready(m) then wake(1) end
end
wake(ended(m))
return {'ok', save(m), redis.call('HGET', K_PAY, id)}
"""

# ARGV: id, token or -1, ms.  Returns {status, meta, payload}.
EXTEND = r"""
local id, tok, ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local m = load(id)
local st = check_lease(m, tok)
if st ~= 'ok' then return {st} end
m.dl = math.max(m.dl, now) + ms
redis.call('ZADD', K_LEASED, m.dl, id)
return {'ok', save(m), redis.call('HGET', K_PAY, id)}
"""

# ARGV: id.  Returns {meta, payload} or {}.  Read-only: an expired lease reads as reclaimed.
GET = r"""
local r = as_read(redis.call('HGET', K_META, ARGV[1]))
if not r then return {} end
return {r, redis.call('HGET', K_PAY, ARGV[1])}
"""

# ARGV: state or "", limit or -1.  Returns meta1, payload1, ... in enqueue order.  Read-only:
# an expired lease is listed as reclaimed (as STATS counts it).
LIST = r"""
local want, limit = ARGV[1], tonumber(ARGV[2])
local out, start = {}, 0
while limit < 0 or #out < 2 * limit do
  local ids = redis.call('ZRANGE', K_ALL, start, start + 499)
  if #ids == 0 then break end
  start = start + #ids
  for _, id in ipairs(ids) do
    local r, st = as_read(redis.call('HGET', K_META, id))
    if r and (want == '' or st == want) then
      out[#out + 1] = r
      out[#out + 1] = redis.call('HGET', K_PAY, id)
      if limit >= 0 and #out >= 2 * limit then break end
    end
  end
end
return out
"""

# ARGV: id or "" (all).  Returns the number requeued, or an error status string.
REQUEUE = r"""
local ids = {}
if ARGV[1] ~= '' then
  local m = load(ARGV[1])
  if not m then return 'nf' end
  if m.st ~= 'dead' then return 'notdead' end
  ids = {ARGV[1]}
else
  ids = redis.call('ZRANGE', K_DEAD, 0, -1)
end
local due = 0
for _, id in ipairs(ids) do
  local m = load(id)
  redis.call('ZREM', K_DEAD, id)
  m.a = 0
  m.why = nil
  m.fin = nil
  m.av = now
  if make_ready(m) then due = due + 1 end
  save(m)
end
wake(due)
return #ids
"""

PURGE = r"""
local n = redis.call('ZCARD', K_ALL)
redis.call('DEL', K_READY, K_DELAYED, K_LEASED, K_DEAD, K_DONE, K_ALL, K_META, K_PAY, K_CANCELLED, K_EXPIRED,
  K_DEFERRED, K_EDGES, K_FAIR, K_NEXT, K_PENDING, K_LINKS)
return n
"""

# ARGV: done retention ms.  Returns {ready, delayed, leased, done, dead, cancelled, expired,
# enqueued_total, acked_total, dead_lettered_total, deferred}.  Read-only: a lease that expired
# and that no lease call has reclaimed yet is counted as what promote() will make it (ready; dead
# when its attempts are used up; cancelled if a cancel was requested), so the counts never depend
# on whether a consumer has looked; dead_lettered_total counts it once it is reclaimed.
STATS = r"""
local keep = tonumber(ARGV[1])
local due = redis.call('ZCOUNT', K_DELAYED, '-inf', now)
local c = redis.call('HMGET', K_CNT, 'enqueued', 'acked', 'dead')
local back, dead, cx = 0, 0, 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_LEASED, '-inf', '(' .. now)) do
  local m = load(id)
  if m then
    if m.cx then cx = cx + 1 elseif m.a >= m.m then dead = dead + 1 else back = back + 1 end
  end
end
return {redis.call('ZCARD', K_READY) + due + back, redis.call('ZCARD', K_DELAYED) - due,
        redis.call('ZCARD', K_LEASED) - back - dead - cx,
        redis.call('ZCOUNT', K_DONE, now - keep, '+inf'), redis.call('ZCARD', K_DEAD) + dead,
        redis.call('ZCOUNT', K_CANCELLED, now - keep, '+inf') + cx, redis.call('ZCOUNT', K_EXPIRED, now - keep, '+inf'),
        tonumber(c[1] or '0'), tonumber(c[2] or '0'), tonumber(c[3] or '0'), redis.call('ZCARD', K_DEFERRED)}
"""

# ARGV: id.  Returns {status, meta, payload}: a ready, delayed or deferred job is cancelled (its
# dependents in turn, unless they allow failure), a leased one marked cancel-requested;
# 'fin:<state>' for a finished job.
CANCEL = r"""
local id = ARGV[1]
local m = load(id)
if not m then return {'nf'} end
while m.st == 'leased' and m.dl < now do
  promote()  -- a lease that ran out is cancelled as what reclaiming makes it (a retry, or dead)
  m = load(id)
  if not m then return {'nf'} end
end
if m.st == 'ready' or m.st == 'deferred' then
  unplace(m, true)
  make_ended(m, 'cancelled')
  if (m.t or 0) > 0 then m.rc = 1 end  -- its last lease ended unacked: that holder's ack is refused
  wake(ended(m))
elseif m.st == 'leased' then
  m.cx = 1
elseif m.st ~= 'cancelled' then
  return {'fin:' .. m.st}
end
return {'ok', save(m), redis.call('HGET', K_PAY, id)}
"""

# ARGV: "1" to pause, "0" to resume.  Resuming wakes sleepers for every due job.
PAUSE = r"""
if ARGV[1] == '1' then
  redis.call('SET', K_PAUSE, '1')
else
  redis.call('DEL', K_PAUSE)
  promote()
  wake(math.max(1, redis.call('ZCARD', K_READY)))
end
return 1
"""

# ARGV: id, token or -1, fraction, message or "", has_message 0/1.  Fenced like an ack.
PROGRESS = r"""
local id, tok = ARGV[1], tonumber(ARGV[2])
local m = load(id)
local st = check_lease(m, tok)
if st ~= 'ok' then return st end
m.pg = tonumber(ARGV[3])
if ARGV[5] == '1' then m.pm = ARGV[4] else m.pm = nil end
save(m)
return 'ok'
"""

# ARGV: n, then n tuples (id, codec byte + payload, priority, attempts, max_attempts,
# available_at ms, enqueued_at ms, state "ready"|"dead", last error or "", timeout ms or 0,
# traceparent or "", tracestate or "").  Jobs whose id is
# retained are skipped (so a rerun adds nothing).  Returns how many were added.
IMPORT = r"""
local n, added = tonumber(ARGV[1]), 0
for i = 0, n - 1 do
  local b = 2 + 12 * i
  local id = ARGV[b]
  if redis.call('HEXISTS', K_META, id) == 0 then
    local s = redis.call('INCR', K_SEQ)
    local m = {id = id, p = tonumber(ARGV[b + 2]), s = s, a = tonumber(ARGV[b + 3]), m = tonumber(ARGV[b + 4]),
               av = tonumber(ARGV[b + 5]), enq = tonumber(ARGV[b + 6]), t = tonumber(ARGV[b + 3])}
    if ARGV[b + 8] ~= '' then m.e = ARGV[b + 8] end
    if tonumber(ARGV[b + 9]) > 0 then m.to = tonumber(ARGV[b + 9]) end
    if ARGV[b + 10] ~= '' then m.tp = ARGV[b + 10] end
    if ARGV[b + 11] ~= '' then m.ts = ARGV[b + 11] end
    if ARGV[b + 7] == 'dead' then make_dead(m) else make_ready(m) end
    redis.call('HSET', K_PAY, id, ARGV[b + 1])
    redis.call('ZADD', K_ALL, s, id)
    save(m)
    added = added + 1
  end
end
wake(added)
if added > 0 then redis.call('HINCRBY', K_CNT, 'enqueued', added) end
return added
"""

# ARGV: id, traceparent.  Keeps the first attempt's traceparent (once; a job not found is left).
TRACE_NOTE = r"""
local m = load(ARGV[1])
if m and not m.fa then m.fa = ARGV[2]; save(m) end
return 1
"""

# ARGV: id, priority or "", delay ms or "".  Returns {status, meta, payload}: status "ok",
# "nf", "leased", or "fin:<state>".  A ready job due now that keeps its priority keeps its turn.
RESCHEDULE = r"""
promote()
local m = load(ARGV[1])
if not m then return {'nf'} end
if m.st == 'leased' then return {'leased'} end
if m.st ~= 'ready' and m.st ~= 'deferred' then return {'fin:' .. m.st} end
local p, av = m.p, m.av
if ARGV[2] ~= '' then p = tonumber(ARGV[2]) end
if ARGV[3] ~= '' then av = now + tonumber(ARGV[3]) end
if m.st == 'deferred' then
  m.p, m.av = p, av
else
  local turn = nil
  if m.rk and m.g ~= nil and p == m.p and ARGV[3] == '' then turn = m.g end  -- its place kept
  unplace(m, true)
  m.p, m.av = p, av
  if make_ready(m, turn) then wake(1) end
end
return {'ok', save(m), redis.call('HGET', K_PAY, ARGV[1])}
"""

# ARGV: id.  Returns id1, seq1, id2, seq2, ...: the retained jobs enqueued depending on it.
DEPENDENTS = r"""
local out = {}
for _, c in ipairs(children(K_LINKS, ARGV[1])) do
  out[#out + 1] = c
  out[#out + 1] = redis.call('ZSCORE', K_ALL, c) or '0'
end
return out
"""

SCRIPTS = {
    "enqueue": ENQUEUE,
    "lease": LEASE,
    "ack": ACK,
    "nack": NACK,
    "extend": EXTEND,
    "get": GET,
    "list": LIST,
    "requeue": REQUEUE,
    "purge": PURGE,
    "stats": STATS,
    "import": IMPORT,
    "cancel": CANCEL,
    "pause": PAUSE,
    "progress": PROGRESS,
    "trace_note": TRACE_NOTE,
    "reschedule": RESCHEDULE,
    "dependents": DEPENDENTS,
}
