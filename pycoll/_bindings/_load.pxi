# Loading: dlopen, the dlsym table, and load()/loaded() (included by _nccl.pyx); where to look is
# _locate.py.

_lock = threading.RLock()


def _forked():
    """After a fork, in the child: a lock of its own (another thread of the parent may have been loading a library
    at the fork: the child's first load waited forever for it)."""
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_forked)
_by_path = {}  # resolved path -> Library
_by_spec = {}  # spec as given -> Library


cdef int _collect_object(dl_phdr_info* info, size_t size, void* data) noexcept:
    if info.dlpi_name != NULL and info.dlpi_name[0] != 0:
        (<list>data).append(<bytes>info.dlpi_name)
    return 0


def _loaded_objects():
    """Paths of every shared object loaded in this process (dl_iterate_phdr)."""
    cdef list names = []
    dl_iterate_phdr(_collect_object, <void*>names)
    return [os.fsdecode(n) for n in names]


def _truncated_elf(path):
    """Why the ELF file ``path`` cannot be loaded whole: shorter than its program headers or its loadable segments say
    (a half-copied or half-downloaded library: dlopen maps past its end, and the process dies of SIGBUS as the loader
    reads there); None for one that is whole, or no ELF file (dlopen says what it is)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
                return None
            bits64, order = head[4] == 2, "<" if head[5] == 1 else ">"
            if bits64 and len(head) < 64:
                return None
            phoff = struct.unpack_from(order + ("Q" if bits64 else "I"), head, 32 if bits64 else 28)[0]
            phentsize, phnum = struct.unpack_from(order + "HH", head, 54 if bits64 else 42)
            if phentsize < (56 if bits64 else 32):
                return None
            if phoff + phentsize * phnum > size:
                return f"its program headers end at byte {phoff + phentsize * phnum}, past its end ({size} bytes)"
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return None  # dlopen says why it cannot read it
    for i in range(phnum):
        if bits64:
            kind, _, offset, _, _, filesz = struct.unpack_from(order + "IIQQQQ", table, i * phentsize)
        else:
            kind, offset, _, _, filesz = struct.unpack_from(order + "IIIII", table, i * phentsize)
        if kind == 1 and offset + filesz > size:  # PT_LOAD
            return f"its segment {i} ends at byte {offset + filesz}, past its end ({size} bytes)"
    return None


cdef Library _open(str target):
    """dlopen ``target`` (a path, or a name for the dynamic linker's search) and wrap it."""
    cdef bytes btarget = os.fsencode(target)
    cdef const char* ctarget = btarget
    cdef void* h
    cdef link_map* lm = NULL
    cdef Library lib
    if "/" in target and not os.path.exists(target):
        raise LibraryError(f"{target}: no such file", target)
    broken = _truncated_elf(target) if "/" in target else None
    if broken is not None:
        raise LibraryError(f"{target}: the file is cut short ({broken}): a copy or download that did not "
                           "finish?", target)
    with nogil:
        h = dlopen(ctarget, RTLD_NOW | RTLD_LOCAL)
    if h == NULL:
        message = _decode(dlerror()) or "dlopen failed"
        if not message.startswith(target):
            message = f"{target}: {message}"
        raise LibraryError(message, target)
    path = target
    if dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 and lm != NULL and lm.l_name != NULL and lm.l_name[0] != 0:
        path = os.fsdecode(<bytes>lm.l_name)
    path = os.path.realpath(path) if "/" in path else path
    if dlsym(h, "ncclGetVersion") == NULL:
        dlerror()
        dlclose(h)
        raise LibraryError(f"{path} does not export ncclGetVersion: not an NCCL-ABI library", path)
    existing = _by_path.get(path)
    if existing is not None:
        dlclose(h)  # drops the extra reference; the object stays loaded
        return existing
    cls = HostLibrary if dlsym(h, "pycollHostGetVersion") != NULL else Library
    dlerror()
    lib = cls.__new__(cls)
    lib.handle = h
    lib.path = path
    lib._exported = {}
    lib._pending_slots = set()
    lib._groups = threading.local()
    _resolve(lib)
    lib.version = lib.get_version()
    if lib._exported.get("pycollHostGetVersion"):
        lib.kind = "host"
    elif any(lib._exported.get(name) for name in RCCL_FUNCTIONS):
        lib.kind = "rccl"
    else:
        lib.kind = "nccl"
    _by_path[path] = lib
    _log.debug("loaded %s (kind %s, version %d, %d declared functions missing)",
               path, lib.kind, lib.version, len(lib.missing))
    return lib


def load(spec=None):
    """Load (once per resolved path) and return a library.

    ``spec``: a path (anything containing "/"); a file name for the dynamic linker's search
    (e.g. "libnccl.so.2"); ``"nccl"`` (a libnccl already loaded in the process, e.g. torch's,
    then the nvidia-nccl wheel via cuda.pathfinder or its package directory, then the system's
    libnccl.so.2); ``"rccl"`` (an already loaded librccl, then librccl.so.1, then
    $ROCM_PATH/lib and /opt/rocm/lib); ``"host"`` (pycoll's libpycoll_host.so next to this
    module); None -> ``$PYCOLL_NCCL_LIBRARY`` if set, else ``"nccl"``. The search order is
    pycoll._bindings._locate. A library exporting pycollHostGetVersion is a :class:`HostLibrary`.

    Raises LibraryError naming everything tried when nothing suitable is found, or when the
    object does not export ``ncclGetVersion``. Missing optional functions never fail loading.
    Raises ValueError naming the variable when a host library is asked for (or found) while one of
    its ``PYCOLL_HOST_*`` variables is invalid (pycoll._settings.check_host_library).
    """
    from_env = spec is None and bool(_settings.explicit(_locate.ENV_VAR))
    spec = _locate.normalize_spec(spec)
    if spec == "host":
        _settings.check_host_library()  # before dlopen: the library reads them as it loads
    try:
        lib = _load_spec(spec)
    except LibraryError as e:
        if not from_env:
            raise
        raise LibraryError(f"${_locate.ENV_VAR}={spec!r}: {e}", getattr(e, "path", None)) from e
    if lib.kind == "host" and spec != "host":
        _settings.check_host_library()
    return lib


def _load_spec(spec):
    if "/" in spec and not os.path.isabs(spec):  # a path relative to the working folder, which may change
        spec = os.path.abspath(spec)
    lib = _by_spec.get(spec)
    if lib is not None:
        return lib
    with _lock:
        lib = _by_spec.get(spec)
        if lib is not None:
            return lib
        if spec not in _locate.KEYWORDS:
            lib = _open(spec)  # its LibraryError says what happened to this one path or name
            _by_spec[spec] = lib
            return lib
        tried = []
        for label, target in _locate.candidates(spec, _loaded_objects() if spec != "host" else ()):
            if isinstance(target, _locate.Nothing):
                tried.append(f"{label}: {target}")
                continue
            try:
                if callable(target):
                    target = target()
                lib = _open(target)
            except LibraryError as exc:
                tried.append(f"{label}: {exc}")
                _log.debug("load(%r): %s: %s", spec, label, exc)
                continue
            _by_spec[spec] = lib
            return lib
        raise LibraryError(f"could not load the {spec} library; tried: " + "; ".join(tried))


def loaded():
    """Libraries loaded so far in this process, in load order."""
    with _lock:
        return list(_by_path.values())


cdef _resolve(Library lib):
    """Fill ``lib.fn`` with dlsym: NULL where the library lacks the function."""
    cdef pycoll_nccl_table* t = &lib.fn
    t.ncclGetVersion = <ncclGetVersion_fn>lib._sym("ncclGetVersion")
    t.ncclGetErrorString = <ncclGetErrorString_fn>lib._sym("ncclGetErrorString")
    t.ncclGetLastError = <ncclGetLastError_fn>lib._sym("ncclGetLastError")
    t.ncclCommGetAsyncError = <ncclCommGetAsyncError_fn>lib._sym("ncclCommGetAsyncError")
    t.ncclResetDebugInit = <ncclResetDebugInit_fn>lib._sym("ncclResetDebugInit")
    t.ncclGetUniqueId = <ncclGetUniqueId_fn>lib._sym("ncclGetUniqueId")
    t.ncclCommGetUniqueId = <ncclCommGetUniqueId_fn>lib._sym("ncclCommGetUniqueId")
    t.ncclCommInitRank = <ncclCommInitRank_fn>lib._sym("ncclCommInitRank")
    t.ncclCommInitAll = <ncclCommInitAll_fn>lib._sym("ncclCommInitAll")
    t.ncclCommInitRankConfig = <ncclCommInitRankConfig_fn>lib._sym("ncclCommInitRankConfig")
    t.ncclCommInitRankScalable = <ncclCommInitRankScalable_fn>lib._sym("ncclCommInitRankScalable")
    t.ncclCommSplit = <ncclCommSplit_fn>lib._sym("ncclCommSplit")
    t.ncclCommShrink = <ncclCommShrink_fn>lib._sym("ncclCommShrink")
    t.ncclCommGrow = <ncclCommGrow_fn>lib._sym("ncclCommGrow")
    t.ncclCommFinalize = <ncclCommFinalize_fn>lib._sym("ncclCommFinalize")
    t.ncclCommDestroy = <ncclCommDestroy_fn>lib._sym("ncclCommDestroy")
    t.ncclCommAbort = <ncclCommAbort_fn>lib._sym("ncclCommAbort")
    t.ncclCommRevoke = <ncclCommRevoke_fn>lib._sym("ncclCommRevoke")
    t.ncclCommSuspend = <ncclCommSuspend_fn>lib._sym("ncclCommSuspend")
    t.ncclCommResume = <ncclCommResume_fn>lib._sym("ncclCommResume")
    t.ncclCommMemStats = <ncclCommMemStats_fn>lib._sym("ncclCommMemStats")
    t.ncclCommCount = <ncclCommCount_fn>lib._sym("ncclCommCount")
    t.ncclCommCuDevice = <ncclCommCuDevice_fn>lib._sym("ncclCommCuDevice")
    t.ncclCommUserRank = <ncclCommUserRank_fn>lib._sym("ncclCommUserRank")
    t.ncclMemAlloc = <ncclMemAlloc_fn>lib._sym("ncclMemAlloc")
    t.ncclMemFree = <ncclMemFree_fn>lib._sym("ncclMemFree")
    t.ncclCommRegister = <ncclCommRegister_fn>lib._sym("ncclCommRegister")
    t.ncclCommDeregister = <ncclCommDeregister_fn>lib._sym("ncclCommDeregister")
    t.ncclCommWindowRegister = <ncclCommWindowRegister_fn>lib._sym("ncclCommWindowRegister")
    t.ncclCommWindowDeregister = <ncclCommWindowDeregister_fn>lib._sym("ncclCommWindowDeregister")
    t.ncclWinGetUserPtr = <ncclWinGetUserPtr_fn>lib._sym("ncclWinGetUserPtr")
    t.ncclRedOpCreatePreMulSum = <ncclRedOpCreatePreMulSum_fn>lib._sym("ncclRedOpCreatePreMulSum")
    t.ncclRedOpDestroy = <ncclRedOpDestroy_fn>lib._sym("ncclRedOpDestroy")
    t.ncclReduce = <ncclReduce_fn>lib._sym("ncclReduce")
    t.ncclBcast = <ncclBcast_fn>lib._sym("ncclBcast")
    t.ncclBroadcast = <ncclBroadcast_fn>lib._sym("ncclBroadcast")
    t.ncclAllReduce = <ncclAllReduce_fn>lib._sym("ncclAllReduce")
    t.ncclReduceScatter = <ncclReduceScatter_fn>lib._sym("ncclReduceScatter")
    t.ncclAllGather = <ncclAllGather_fn>lib._sym("ncclAllGather")
    t.ncclAlltoAll = <ncclAlltoAll_fn>lib._sym("ncclAlltoAll")
    t.ncclGather = <ncclGather_fn>lib._sym("ncclGather")
    t.ncclScatter = <ncclScatter_fn>lib._sym("ncclScatter")
    t.ncclAllReduceConfig = <ncclAllReduceConfig_fn>lib._sym("ncclAllReduceConfig")
    t.ncclBroadcastConfig = <ncclBroadcastConfig_fn>lib._sym("ncclBroadcastConfig")
    t.ncclReduceConfig = <ncclReduceConfig_fn>lib._sym("ncclReduceConfig")
    t.ncclAllGatherConfig = <ncclAllGatherConfig_fn>lib._sym("ncclAllGatherConfig")
    t.ncclReduceScatterConfig = <ncclReduceScatterConfig_fn>lib._sym("ncclReduceScatterConfig")
    t.ncclAlltoAllConfig = <ncclAlltoAllConfig_fn>lib._sym("ncclAlltoAllConfig")
    t.ncclGatherConfig = <ncclGatherConfig_fn>lib._sym("ncclGatherConfig")
    t.ncclScatterConfig = <ncclScatterConfig_fn>lib._sym("ncclScatterConfig")
    t.ncclSend = <ncclSend_fn>lib._sym("ncclSend")
    t.ncclRecv = <ncclRecv_fn>lib._sym("ncclRecv")
    t.ncclPutSignal = <ncclPutSignal_fn>lib._sym("ncclPutSignal")
    t.ncclSignal = <ncclSignal_fn>lib._sym("ncclSignal")
    t.ncclWaitSignal = <ncclWaitSignal_fn>lib._sym("ncclWaitSignal")
    t.ncclGroupStart = <ncclGroupStart_fn>lib._sym("ncclGroupStart")
    t.ncclGroupEnd = <ncclGroupEnd_fn>lib._sym("ncclGroupEnd")
    t.ncclGroupSimulateEnd = <ncclGroupSimulateEnd_fn>lib._sym("ncclGroupSimulateEnd")
    t.ncclParamBind = <ncclParamBind_fn>lib._sym("ncclParamBind")
    t.ncclParamGetI8 = <ncclParamGetI8_fn>lib._sym("ncclParamGetI8")
    t.ncclParamGetI16 = <ncclParamGetI16_fn>lib._sym("ncclParamGetI16")
    t.ncclParamGetI32 = <ncclParamGetI32_fn>lib._sym("ncclParamGetI32")
    t.ncclParamGetI64 = <ncclParamGetI64_fn>lib._sym("ncclParamGetI64")
    t.ncclParamGetU8 = <ncclParamGetU8_fn>lib._sym("ncclParamGetU8")
    t.ncclParamGetU16 = <ncclParamGetU16_fn>lib._sym("ncclParamGetU16")
    t.ncclParamGetU32 = <ncclParamGetU32_fn>lib._sym("ncclParamGetU32")
    t.ncclParamGetU64 = <ncclParamGetU64_fn>lib._sym("ncclParamGetU64")
    t.ncclParamGetStr = <ncclParamGetStr_fn>lib._sym("ncclParamGetStr")
    t.ncclParamGet = <ncclParamGet_fn>lib._sym("ncclParamGet")
    t.ncclParamGetParameter = <ncclParamGetParameter_fn>lib._sym("ncclParamGetParameter")
    t.ncclParamGetAllParameterKeys = <ncclParamGetAllParameterKeys_fn>lib._sym("ncclParamGetAllParameterKeys")
    t.ncclParamDumpAll = <ncclParamDumpAll_fn>lib._sym("ncclParamDumpAll")
    t.ncclSetEncryption = <ncclSetEncryption_fn>lib._sym("ncclSetEncryption")
    t.ncclResetDebugInitInternal = <ncclResetDebugInitInternal_fn>lib._sym("ncclResetDebugInitInternal")
    t.ncclCommQueryProperties = <ncclCommQueryProperties_fn>lib._sym("ncclCommQueryProperties")
    t.ncclDevCommCreate = <ncclDevCommCreate_fn>lib._sym("ncclDevCommCreate")
    t.ncclDevCommDestroy = <ncclDevCommDestroy_fn>lib._sym("ncclDevCommDestroy")
    t.ncclGetLsaMultimemDevicePointer = <ncclGetLsaMultimemDevicePointer_fn>lib._sym("ncclGetLsaMultimemDevicePointer")
    t.ncclGetMultimemDevicePointer = <ncclGetMultimemDevicePointer_fn>lib._sym("ncclGetMultimemDevicePointer")
    t.ncclGetLsaDevicePointer = <ncclGetLsaDevicePointer_fn>lib._sym("ncclGetLsaDevicePointer")
    t.ncclGetPeerDevicePointer = <ncclGetPeerDevicePointer_fn>lib._sym("ncclGetPeerDevicePointer")
    t.ncclGetMultimemDeviceLeInfo = <ncclGetMultimemDeviceLeInfo_fn>lib._sym("ncclGetMultimemDeviceLeInfo")
    t.ncclGetCftDeviceLeInfo = <ncclGetCftDeviceLeInfo_fn>lib._sym("ncclGetCftDeviceLeInfo")
    t.ncclGetPeerDeviceLeInfo = <ncclGetPeerDeviceLeInfo_fn>lib._sym("ncclGetPeerDeviceLeInfo")
    t.ncclTeamWorld = <ncclTeamWorld_fn>lib._sym("ncclTeamWorld")
    t.ncclTeamLsa = <ncclTeamLsa_fn>lib._sym("ncclTeamLsa")
    t.ncclTeamCft = <ncclTeamCft_fn>lib._sym("ncclTeamCft")
    t.ncclTeamCftMultimem = <ncclTeamCftMultimem_fn>lib._sym("ncclTeamCftMultimem")
    t.ncclTeamRankToWorld = <ncclTeamRankToWorld_fn>lib._sym("ncclTeamRankToWorld")
    t.ncclTeamRankToLsa = <ncclTeamRankToLsa_fn>lib._sym("ncclTeamRankToLsa")
    t.ncclTeamRail = <ncclTeamRail_fn>lib._sym("ncclTeamRail")
    t.ncclLsaBarrierCreateRequirement = <ncclLsaBarrierCreateRequirement_fn>lib._sym("ncclLsaBarrierCreateRequirement")
    t.ncclGinBarrierCreateRequirement = <ncclGinBarrierCreateRequirement_fn>lib._sym("ncclGinBarrierCreateRequirement")
    t.ncclLLA2ACalcSlots = <ncclLLA2ACalcSlots_fn>lib._sym("ncclLLA2ACalcSlots")
    t.ncclLLA2ACreateRequirement = <ncclLLA2ACreateRequirement_fn>lib._sym("ncclLLA2ACreateRequirement")
    t.ncclGinOutboxCreateRequirement = <ncclGinOutboxCreateRequirement_fn>lib._sym("ncclGinOutboxCreateRequirement")
    t.ncclGinInboxA2ACreateRequirement = <ncclGinInboxA2ACreateRequirement_fn>lib._sym("ncclGinInboxA2ACreateRequirement")
    t.pycollHostGetVersion = <pycollHostGetVersion_fn>lib._sym("pycollHostGetVersion")
    t.pycollStreamCreate = <pycollStreamCreate_fn>lib._sym("pycollStreamCreate")
    t.pycollStreamDestroy = <pycollStreamDestroy_fn>lib._sym("pycollStreamDestroy")
    t.pycollStreamSynchronize = <pycollStreamSynchronize_fn>lib._sym("pycollStreamSynchronize")
    t.pycollStreamQuery = <pycollStreamQuery_fn>lib._sym("pycollStreamQuery")
    t.pycollStreamWaitRoom = <pycollStreamWaitRoom_fn>lib._sym("pycollStreamWaitRoom")
    t.pycollStreamWaitEvent = <pycollStreamWaitEvent_fn>lib._sym("pycollStreamWaitEvent")
    t.pycollEventCreate = <pycollEventCreate_fn>lib._sym("pycollEventCreate")
    t.pycollEventDestroy = <pycollEventDestroy_fn>lib._sym("pycollEventDestroy")
    t.pycollEventRecord = <pycollEventRecord_fn>lib._sym("pycollEventRecord")
    t.pycollEventQuery = <pycollEventQuery_fn>lib._sym("pycollEventQuery")
    t.pycollEventSynchronize = <pycollEventSynchronize_fn>lib._sym("pycollEventSynchronize")
    t.pycollEventElapsedTime = <pycollEventElapsedTime_fn>lib._sym("pycollEventElapsedTime")
    t.pycollStreamCreateWithFlags = <pycollStreamCreateWithFlags_fn>lib._sym("pycollStreamCreateWithFlags")
    t.pycollStreamSetFlags = <pycollStreamSetFlags_fn>lib._sym("pycollStreamSetFlags")
    t.pycollEventWait = <pycollEventWait_fn>lib._sym("pycollEventWait")
    t.pycollEventWaitRun = <pycollEventWait_fn>lib._sym("pycollEventWaitRun")
    t.pycollEventArm = <pycollEventArm_fn>lib._sym("pycollEventArm")
    t.pycollEventFire = <pycollEventFire_fn>lib._sym("pycollEventFire")
    t.pycollStreamSetLegacy = <pycollStreamSetLegacy_fn>lib._sym("pycollStreamSetLegacy")
    t.pycollStreamResolve = <pycollStreamResolve_fn>lib._sym("pycollStreamResolve")
    t.pycollStreamBeginCapture = <pycollStreamBeginCapture_fn>lib._sym("pycollStreamBeginCapture")
    t.pycollStreamEndCapture = <pycollStreamEndCapture_fn>lib._sym("pycollStreamEndCapture")
    t.pycollGraphLaunch = <pycollGraphLaunch_fn>lib._sym("pycollGraphLaunch")
    t.pycollGraphDestroy = <pycollGraphDestroy_fn>lib._sym("pycollGraphDestroy")
    t.pycollCommWaitReady = <pycollCommWaitReady_fn>lib._sym("pycollCommWaitReady")
    t.pycollCommPeerOpen = <pycollCommPeerOpen_fn>lib._sym("pycollCommPeerOpen")
    t.pycollCommPeerProcess = <pycollCommPeerProcess_fn>lib._sym("pycollCommPeerProcess")
    t.pycollCommEventsClean = <pycollCommEventsClean_fn>lib._sym("pycollCommEventsClean")
    t.pycollCommNoteFailure = <pycollCommNoteFailure_fn>lib._sym("pycollCommNoteFailure")
    for name in RCCL_FUNCTIONS:
        lib._sym(name)
