# Argument conversion: Python values -> C arguments (included by _nccl.pyx); every check runs
# before any C call.

cdef object _UINTPTR_MAX = (<object>1 << (8 * sizeof(uintptr_t))) - 1
cdef object _SIZE_MAX = (<object>1 << (8 * sizeof(size_t))) - 1

cdef object _index(object value, str what):
    if value is None:
        raise TypeError(f"{what} must be an int, not None")
    try:
        return PyNumber_Index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


cdef long long _ll(object v, int* overflow) except? -1:
    """An exact int (from _index) as a C long long; *overflow is -1/+1 when it does not fit."""
    return PyLong_AsLongLongAndOverflow(v, overflow)


cdef uintptr_t _addr(object value, str what) except? 0:
    """A handle or address: an int in [0, UINTPTR_MAX]; 0 is NULL."""
    cdef int overflow = 0
    cdef long long x
    if value is None:
        raise TypeError(f"{what} must be an int handle or address (0 for NULL), not None")
    v = _index(value, what)
    x = _ll(v, &overflow)
    if overflow == 0 and x >= 0:
        return <uintptr_t>x
    if overflow > 0 and v <= _UINTPTR_MAX:
        return <uintptr_t>v
    raise ValueError(f"{what} must be an address in [0, 2**{8 * sizeof(uintptr_t)}), got {v}")


cdef size_t _count(object value, str what) except? 0:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, what)
    x = _ll(v, &overflow)
    if overflow == 0 and x >= 0:
        return <size_t>x
    if overflow < 0 or (overflow == 0 and x < 0):
        raise ValueError(f"{what} must be >= 0, got {v}")
    if v > _SIZE_MAX:
        raise ValueError(f"{what} is too large for size_t: {v}")
    return <size_t>v


cdef int _cint(object value, str what, long long lo=INT_MIN, long long hi=INT_MAX) except? -1:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, what)
    x = _ll(v, &overflow)
    if overflow == 0 and lo <= x <= hi:
        return <int>x
    if lo == 0 and (overflow < 0 or (overflow == 0 and x < 0)):
        raise ValueError(f"{what} must be >= 0, got {v}")
    raise ValueError(f"{what} must be in [{lo}, {hi}], got {v}")


cdef uint64_t _timeout_ns(object timeout) except? 0xFFFFFFFFFFFFFFFF:
    """A wait's ``timeout`` in seconds as nanoseconds (past 1e9 s: for ever): whatever ``float()`` takes but a bool or
    text (numpy scalars and 0-d arrays, Decimal, as a C double argument took them); TypeError for anything else,
    ValueError for a negative one or NaN, each naming it."""
    cdef double t
    if isinstance(timeout, (bool, str, bytes, bytearray)):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    try:
        t = float(timeout)
    except OverflowError:  # an int past a double's range: for ever, or refused below
        t = 1e9 if timeout > 0 else -1.0
    except (TypeError, ValueError):
        raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}") from None
    if not t >= 0:
        text = str(timeout)
        raise ValueError(f"timeout must be >= 0 seconds, got {text if len(text) <= 32 else text[:29] + '...'}")
    return <uint64_t>(t * 1e9) if t < 1e9 else <uint64_t>0xFFFFFFFFFFFFFFFF


cdef int _dtype(object value) except -1:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, "datatype")
    x = _ll(v, &overflow)
    if overflow == 0 and 0 <= x < <int>ncclNumTypes:
        return <int>x
    raise ValueError(f"unknown datatype {v}: an ncclDataType_t is 0..{<int>ncclNumTypes - 1} (see DataType)")


cdef int _op(object value) except -1:
    cdef int overflow = 0
    cdef long long x
    v = _index(value, "op")
    x = _ll(v, &overflow)
    if overflow == 0 and 0 <= x <= INT_MAX:
        return <int>x
    raise ValueError(f"unknown op {v}: an ncclRedOp_t is 0..4 (see RedOp) or a dynamic op id >= 5 "
                     "from red_op_create_pre_mul_sum")


cdef ncclComm_t _comm(object value) except? NULL:
    return <ncclComm_t>_addr(value, "comm")


cdef void* _ptr(object value, str what) except? NULL:
    return <void*>_addr(value, what)


cdef str _decode(const char* s):
    if s == NULL:
        return ""
    return s[:strlen(s)].decode("utf-8", "replace")


cdef ncclUniqueId* _uid_ptr(object uid, str what) except NULL:
    if isinstance(uid, UniqueId):
        return &(<UniqueId>uid).c
    raise TypeError(f"{what} must be a UniqueId, not {type(uid).__name__}")


cdef ncclConfig_t* _config_ptr(object config) except? NULL:
    if config is None:
        return NULL
    if isinstance(config, Config):
        return &(<Config>config).c
    raise TypeError(f"config must be a Config or None, not {type(config).__name__}")



cdef const ncclCollConfig_t* _coll_config_ptr(object config) except? NULL:
    if config is None:
        return NULL
    if isinstance(config, CollConfig):
        return &(<CollConfig>config).c
    raise TypeError(f"config must be a CollConfig or None, not {type(config).__name__}")


cdef bytes _c_string(object value, str what):
    """str/bytes/None -> NUL-free bytes or None."""
    if value is None:
        return None
    if isinstance(value, str):
        data = (<str>value).encode("utf-8")
    elif isinstance(value, bytes):
        data = value
    else:
        raise TypeError(f"{what} must be str, bytes or None, not {type(value).__name__}")
    if b"\0" in data:
        raise ValueError(f"{what} must not contain NUL characters")
    return data


cdef unsigned long long _unsigned(object value, str what) except? 0:
    v = _index(value, what)
    if v < 0 or v > UINT_MAX:
        raise ValueError(f"{what} must be in [0, {UINT_MAX}], got {v}")
    return <unsigned long long>v



cdef void* _handle(object value, str what) except NULL:
    """A handle that must not be NULL."""
    cdef uintptr_t v = _addr(value, what)
    if v == 0:
        raise ValueError(f"{what} must be a valid handle, not 0 (NULL)")
    return <void*>v


cdef bytes _param_key(object key):
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    data = (<str>key).encode("utf-8")
    if b"\0" in data:
        raise ValueError("key must not contain NUL characters")
    return data


cdef list _unique_id_list(object unique_ids, int nranks):
    """One UniqueId or a sequence of 1..nranks of them, as a checked list."""
    if isinstance(unique_ids, UniqueId):
        unique_ids = [unique_ids]
    ids = list(unique_ids)
    if not ids:
        raise ValueError("unique_ids must hold at least one UniqueId")
    if len(ids) > nranks:
        raise ValueError(f"unique_ids holds {len(ids)} ids, more than nranks ({nranks})")
    for i, uid in enumerate(ids):
        _uid_ptr(uid, f"unique_ids[{i}]")
    return ids


cdef ncclUniqueId* _unique_id_array(list ids) except NULL:
    """A calloc'ed copy of a _unique_id_list (the caller frees it)."""
    cdef ncclUniqueId* out = <ncclUniqueId*>calloc(len(ids), sizeof(ncclUniqueId))
    if out == NULL:
        raise MemoryError()
    for i in range(len(ids)):
        out[i] = (<UniqueId>ids[i]).c
    return out


cdef list _devlist(object devlist, int ndev):
    devs = [_cint(d, f"devlist[{j}]", 0) for j, d in enumerate(devlist)]
    if len(devs) != ndev:
        raise ValueError(f"devlist holds {len(devs)} devices, ndev is {ndev}")
    return devs


cdef list _exclude_ranks(object exclude_ranks):
    if isinstance(exclude_ranks, (str, bytes)):
        raise TypeError("exclude_ranks must be a sequence of ints")
    try:
        ranks = [_cint(x, "exclude_ranks[...]", 0) for x in exclude_ranks]
    except TypeError as exc:
        raise TypeError(f"exclude_ranks must be a sequence of ints: {exc}") from None
    if not ranks:
        raise ValueError("exclude_ranks must name at least one rank (NCCL requires excludeRanksCount > 0)")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"exclude_ranks holds duplicates: {ranks}")
    return ranks


cdef int* _int_array(list values) except NULL:
    """A calloc'ed copy of a list of C ints (the caller, or the CommSlot holding it, frees it)."""
    cdef int* out = <int*>calloc(len(values), sizeof(int))
    if out == NULL:
        raise MemoryError()
    for i in range(len(values)):
        out[i] = values[i]
    return out


cdef list _signal_rows(object descs):
    """wait_signal's descs as checked (op_count, peer, sig_idx, ctx) tuples, at least one."""
    rows = []
    for i, desc in enumerate(descs):
        try:
            op_cnt, peer, sig_idx, ctx = desc
        except (TypeError, ValueError):
            raise TypeError(f"descs[{i}] must be (op_count, peer, sig_idx, ctx)") from None
        rows.append((_cint(op_cnt, "op_count", 0), _cint(peer, "peer", 0),
                     _cint(sig_idx, "sig_idx", 0), _cint(ctx, "ctx", 0)))
    if not rows:
        raise ValueError("descs must hold at least one (op_count, peer, sig_idx, ctx)")
    return rows


cdef ncclWaitSignalDesc_t* _signal_descs(list rows) except NULL:
    """A calloc'ed ncclWaitSignalDesc_t array of _signal_rows (the caller frees it)."""
    cdef ncclWaitSignalDesc_t* d = <ncclWaitSignalDesc_t*>calloc(len(rows), sizeof(ncclWaitSignalDesc_t))
    if d == NULL:
        raise MemoryError()
    for i in range(len(rows)):
        d[i].opCnt, d[i].peer, d[i].sigIdx, d[i].ctx = rows[i]
    return d


cdef ncclUniqueId* _uid_copy(const ncclUniqueId* src) except NULL:
    """A calloc'ed copy of one unique id (a CommSlot holds and frees it)."""
    cdef ncclUniqueId* out = <ncclUniqueId*>calloc(1, sizeof(ncclUniqueId))
    if out == NULL:
        raise MemoryError()
    out[0] = src[0]
    return out


cdef ncclSimInfo_t _sim_info():
    cdef ncclSimInfo_t info
    info.size = sizeof(ncclSimInfo_t)
    info.magic = PYCOLL_NCCL_SIM_INFO_MAGIC
    info.version = NCCL_VERSION_CODE
    info.estimatedTime = -1.0
    return info


cdef ncclEncryptionConfig_t _encryption_config(int mode, bytes psk):
    """The config for ncclSetEncryption; its ``psk`` points into ``psk``, which must outlive it."""
    cdef ncclEncryptionConfig_t cfg
    cfg.size = sizeof(ncclEncryptionConfig_t)
    cfg.magic = NCCL_API_MAGIC
    cfg.version = NCCL_VERSION_CODE
    cfg.mode = mode
    cfg.psk = NULL if psk is None else PyBytes_AS_STRING(psk)
    return cfg
