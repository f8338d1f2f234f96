# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of the per-record hot loops (pure, no I/O): ``read_records`` and
``read_columns`` (reader.py's), and ``BatchBuilder`` (builder.py's), with the same signatures,
results and errors.

Built by ``pip install`` when a C compiler is there (setup.py; optional, the pure modules are
the fallback) and chosen by :mod:`tidewire.records._impl`. The conformance suite in
tests/records runs every test against both implementations.

How the readers stay exactly as strict as the reference: the loop decodes each record with
the checks of :func:`tidewire.records.reader.iter_records` (varint widths and overflow,
lengths within the record, offset deltas rising, header keys UTF-8, no byte left over), and at
the first thing wrong it stops and asks the reference reader to raise its error, so the error
class and message are the reference's by construction. Values that do not fit in 64 bits
(offsets or timestamps past the int64 range, which Python ints hold) are handed to the pure
reader whole.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.buffer cimport PyBUF_READ, PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_Append, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcpy, memset

from tidewire.errors import InvalidRecordError
from tidewire.records import reader as _pure_reader
from tidewire.records.builder import _encode_headers as _pure_encode_headers
from tidewire.records.builder import append_record as _pure_append_record
from tidewire.records import varint as _pure_varint
from tidewire.records.batch import (
    BATCH_OVERHEAD,
    TimestampType,
    seal_batch,
)
from tidewire.records.compression import MAX_DECOMPRESSED_BYTES, Codec, check_codec, compress, decompress

cdef extern from *:
    """
    /* A record of the factory type (a tuple subclass such as a NamedTuple) holding the 7
       items, each reference stolen. On CPython before 3.14 this is what tuple.__new__(cls,
       items) does after building a tuple of the items (allocate the subtype, fill it),
       without that tuple; elsewhere it goes through tuple.__new__. */
    static PyObject* tw_record(PyObject* cls, PyObject* a, PyObject* b, PyObject* c,
                               PyObject* d, PyObject* e, PyObject* f, PyObject* g) {
        PyObject* made;
    #if PY_VERSION_HEX < 0x030E0000 && !defined(PYPY_VERSION)
        PyTypeObject* t = (PyTypeObject*)cls;
        if (t == &PyTuple_Type) {
            made = PyTuple_New(7);
        } else {
            made = t->tp_alloc(t, 7);
        }
        if (made == NULL) goto fail;
        PyTuple_SET_ITEM(made, 0, a); PyTuple_SET_ITEM(made, 1, b);
        PyTuple_SET_ITEM(made, 2, c); PyTuple_SET_ITEM(made, 3, d);
        PyTuple_SET_ITEM(made, 4, e); PyTuple_SET_ITEM(made, 5, f);
        PyTuple_SET_ITEM(made, 6, g);
        return made;
    #else
        PyObject* items = PyTuple_New(7);
        PyObject* args;
        if (items == NULL) goto fail;
        PyTuple_SET_ITEM(items, 0, a); PyTuple_SET_ITEM(items, 1, b);
        PyTuple_SET_ITEM(items, 2, c); PyTuple_SET_ITEM(items, 3, d);
        PyTuple_SET_ITEM(items, 4, e); PyTuple_SET_ITEM(items, 5, f);
        PyTuple_SET_ITEM(items, 6, g);
        if ((PyTypeObject*)cls == &PyTuple_Type) return items;
        args = PyTuple_Pack(1, items);
        Py_DECREF(items);
        if (args == NULL) return NULL;
        made = PyTuple_Type.tp_new((PyTypeObject*)cls, args, NULL);
        Py_DECREF(args);
        return made;
    #endif
    fail:
        Py_DECREF(a); Py_DECREF(b); Py_DECREF(c); Py_DECREF(d);
        Py_DECREF(e); Py_DECREF(f); Py_DECREF(g);
        return NULL;
    }
    """
    object tw_record(object cls, PyObject* a, PyObject* b, PyObject* c, PyObject* d,
                     PyObject* e, PyObject* f, PyObject* g)
    int __builtin_add_overflow(int64_t, int64_t, int64_t*) nogil
    int __builtin_sub_overflow(int64_t, int64_t, int64_t*) nogil

__all__ = [
    "BatchBuilder", "Spans", "binary_columns", "int64_columns", "read_columns", "read_records",
    "read_spans",
]

cdef Py_ssize_t _OVERHEAD = BATCH_OVERHEAD
cdef object _TUPLE = tuple
cdef object _EMPTY = ()

# What the scan loop hands back.
cdef enum:
    DONE = 0        # every record read (or the window ended): the result is complete
    MALFORMED = 1   # something the reference reader refuses: it names the fault
    TOO_WIDE = 2    # an offset or timestamp past 64 bits: the pure reader takes the batch


cdef inline int _varint(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t end, bint wide,
                        int64_t* out) noexcept nogil:
    """One zigzag varint at p[pos[0]:end]: 0 and the value, or -1 for what varint.decode
    refuses (too long for its width, overflowing it) or input ending inside it."""
    cdef Py_ssize_t i = pos[0]
    cdef Py_ssize_t start = i
    cdef Py_ssize_t limit = 10 if wide else 5
    cdef uint64_t r = 0
    cdef uint64_t b
    cdef int shift = 0
    while True:
        if i >= end:
            return -1
        b = p[i]
        i += 1
        if shift == 63 and (b & 0x7F) > 1:
            return -1  # the 10th byte of a 64-bit varint holds one bit at most
        r |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if i - start >= limit:
            return -1
    if not wide and r > <uint64_t>0xFFFFFFFFU:
        return -1  # zigzag maps the int32 range exactly onto 0..2**32-1
    out[0] = <int64_t>((r >> 1) ^ (~(r & 1) + 1))
    pos[0] = i
    return 0


cdef inline object _field(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t rec_end, int* bad):
    """A key, value or header value: bytes, or None for length -1; sets bad[0] on a fault."""
    cdef int64_t n
    if _varint(p, pos, rec_end, False, &n) < 0 or n < -1 or n > rec_end - pos[0]:
        bad[0] = 1
        return None
    if n == -1:
        return None
    cdef Py_ssize_t at = pos[0]
    pos[0] = at + <Py_ssize_t>n
    return PyBytes_FromStringAndSize(<const char*>p + at, <Py_ssize_t>n)


cdef object _headers(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t rec_end, int* bad):
    """A record's headers as a tuple of (str, bytes | None); sets bad[0] on a fault."""
    cdef int64_t count
    cdef int64_t j
    cdef int64_t n
    cdef Py_ssize_t at
    if _varint(p, pos, rec_end, False, &count) < 0 or count < 0 or count > rec_end - pos[0]:
        bad[0] = 1
        return None
    if count == 0:
        return _EMPTY
    out = PyTuple_New(<Py_ssize_t>count)
    for j in range(count):
        if _varint(p, pos, rec_end, False, &n) < 0 or n < 0 or n > rec_end - pos[0]:
            bad[0] = 1  # a null key (-1) is refused too
            return None
        at = pos[0]
        pos[0] = at + <Py_ssize_t>n
        try:
            name = PyUnicode_DecodeUTF8(<const char*>p + at, <Py_ssize_t>n, NULL)
        except UnicodeDecodeError:
            bad[0] = 1
            return None
        value = _field(p, pos, rec_end, bad)
        if bad[0]:
            return None
        pair = PyTuple_New(2)
        Py_INCREF(name)
        PyTuple_SET_ITEM(pair, 0, name)
        Py_INCREF(value)
        PyTuple_SET_ITEM(pair, 1, value)
        Py_INCREF(pair)
        PyTuple_SET_ITEM(out, j, pair)
    return out


cdef int _scan(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t base, int64_t first_ts,
               int64_t last_delta, int64_t count, int64_t lo, int64_t hi, object factory,
               object topic, object partition, list rows, list offsets, list timestamps,
               list keys, list values, list headers) except -1:
    """Decode the records of p[pos:end] into ``rows`` (factory tuples) or, when ``rows`` is
    None, into the five column lists. Returns DONE, MALFORMED or TOO_WIDE.

    Records of one batch mostly share a timestamp (a producer appends hundreds a
    millisecond): a record with the previous record's timestamp gets the same int object
    (one allocation, and one free later, less a record)."""
    cdef int64_t i, length, ts_delta, delta, offset, ts
    cdef int64_t prev = -1
    cdef int64_t last_ts = 0
    cdef object t = None
    cdef Py_ssize_t rec_end
    cdef int bad = 0
    for i in range(count):
        if pos >= end:
            return MALFORMED
        if _varint(p, &pos, end, False, &length) < 0 or length < 6 or length > end - pos:
            return MALFORMED
        rec_end = pos + <Py_ssize_t>length
        pos += 1  # record attributes (unused)
        if _varint(p, &pos, rec_end, True, &ts_delta) < 0:
            return MALFORMED
        if _varint(p, &pos, rec_end, False, &delta) < 0 or delta <= prev or delta > last_delta:
            return MALFORMED
        prev = delta
        key = _field(p, &pos, rec_end, &bad)
        if bad:
            return MALFORMED
        value = _field(p, &pos, rec_end, &bad)
        if bad:
            return MALFORMED
        if pos < rec_end and p[pos] == 0:
            hdrs = _EMPTY
            pos += 1
        else:
            hdrs = _headers(p, &pos, rec_end, &bad)
            if bad:
                return MALFORMED
        if pos != rec_end:
            return MALFORMED
        if __builtin_add_overflow(base, delta, &offset) or __builtin_add_overflow(
            first_ts, ts_delta, &ts
        ):
            return TOO_WIDE
        if offset < lo:
            continue
        if offset > hi:
            return DONE
        if t is None or ts != last_ts:
            t = PyLong_FromLongLong(ts)
            last_ts = ts
        if rows is None:
            PyList_Append(offsets, PyLong_FromLongLong(offset))
            PyList_Append(timestamps, t)
            PyList_Append(keys, key)
            PyList_Append(values, value)
            PyList_Append(headers, hdrs)
            continue
        o = PyLong_FromLongLong(offset)
        # tw_record steals one reference to each item: give it its own.
        Py_INCREF(topic)
        Py_INCREF(partition)
        Py_INCREF(o)
        Py_INCREF(t)
        Py_INCREF(key)
        Py_INCREF(value)
        Py_INCREF(hdrs)
        PyList_Append(rows, tw_record(
            factory, <PyObject*>topic, <PyObject*>partition, <PyObject*>o, <PyObject*>t,
            <PyObject*>key, <PyObject*>value, <PyObject*>hdrs
        ))
    if pos != end:
        return MALFORMED
    return DONE


cdef object _read(object buf, object start, object h, object factory, object topic,
                  object partition, object min_offset, object decompression_limit,
                  object max_offset):
    """read_records (``factory`` given) or read_columns (``factory`` None)."""
    cdef Py_buffer view
    cdef Py_ssize_t pos, end, size
    cdef int64_t lo, hi, base, first_ts, last_delta, count
    cdef int status
    cdef list rows = None
    cdef list offsets = None, timestamps = None, keys = None, values = None, headers = None
    try:
        lo = min_offset
        hi = max_offset
        base = h.base_offset
        first_ts = h.first_timestamp
        last_delta = h.last_offset_delta
        count = h.records_count
    except OverflowError:
        return _pure(buf, start, h, factory, topic, partition, min_offset,
                     decompression_limit, max_offset)
    size = h.size
    if h.codec:
        section = memoryview(buf)[start : start + size][_OVERHEAD:]
        data = bytes(decompress(h.codec, section, decompression_limit))
        pos = 0
        end = PyBytes_GET_SIZE(data)
    else:
        data = buf
        pos = start + _OVERHEAD
        end = start + size
    if factory is None:
        offsets, timestamps, keys, values, headers = [], [], [], [], []
    else:
        rows = []
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or end > view.len:
            status = MALFORMED
        else:
            status = _scan(<const uint8_t*>view.buf, pos, end, base, first_ts, last_delta,
                           count, lo, hi, factory, topic, partition, rows, offsets,
                           timestamps, keys, values, headers)
    finally:
        PyBuffer_Release(&view)
    if status == DONE:
        if factory is None:
            return (offsets, timestamps, keys, values, headers)
        return rows
    if status == TOO_WIDE:
        return _pure(buf, start, h, factory, topic, partition, min_offset,
                     decompression_limit, max_offset)
    # Malformed: the reference reader names the fault.
    for _ in _pure_reader.iter_records(
        memoryview(buf)[start : start + size], decompression_limit=decompression_limit
    ):
        pass
    raise InvalidRecordError("the batch's records are malformed")


cdef object _pure(object buf, object start, object h, object factory, object topic,
                  object partition, object min_offset, object decompression_limit,
                  object max_offset):
    if factory is None:
        return _pure_reader.read_columns(buf, start, h, min_offset, decompression_limit,
                                         max_offset)
    return _pure_reader.read_records(buf, start, h, factory, topic, partition, min_offset,
                                     decompression_limit, max_offset)


def read_records(buf, start, h, factory, topic, partition, min_offset=0,
                 decompression_limit=MAX_DECOMPRESSED_BYTES, max_offset=2**63 - 1):
    """See :func:`tidewire.records.reader.read_records` (the same contract)."""
    if not (isinstance(factory, type) and issubclass(factory, tuple)):
        tuple.__new__(factory, ())  # raises tuple.__new__'s own TypeError
    return _read(buf, start, h, factory, topic, partition, min_offset, decompression_limit,
                 max_offset)


def read_columns(buf, start, h, min_offset=0, decompression_limit=MAX_DECOMPRESSED_BYTES,
                 max_offset=2**63 - 1):
    """See :func:`tidewire.records.reader.read_columns` (the same contract)."""
    return _read(buf, start, h, None, None, None, min_offset, decompression_limit, max_offset)


# ---------------------------------------------------------------------------------------
# Spans: a batch's records checked and located in one pass, their objects made when asked

# One row of a Spans table: the record's offset, timestamp, key and value (where each starts
# in the data, and its length, -1 for None).
cdef enum:
    _SP_OFFSET = 0
    _SP_TS = 1
    _SP_KEY = 2
    _SP_VALUE = 4
    _SP_WIDTH = 6


cdef class Spans:
    """See :class:`tidewire.records.reader.Spans` (the same methods and results).

    Holds the batch's data (the fetched buffer itself when not compressed: a buffer export
    keeps a bytearray from being resized meanwhile) and a table of six int64 a record, so
    handing out a batch makes no object per record but its headers (the shared empty tuple
    for records without any); a column's ints and bytes are made when it is asked for.
    """

    cdef Py_buffer _view
    cdef bint _held
    cdef object _data
    cdef int64_t* _table
    cdef Py_ssize_t _n
    cdef list _headers

    def __cinit__(self):
        self._held = False
        self._table = NULL
        self._n = 0

    def __dealloc__(self):
        if self._held:
            PyBuffer_Release(&self._view)
        PyMem_Free(self._table)

    def __len__(self):
        return self._n

    @property
    def last_offset(self):
        """The offset of the last record (-1 when there is none)."""
        if self._n == 0:
            return -1
        return self._table[(self._n - 1) * _SP_WIDTH + _SP_OFFSET]

    def column(self, Py_ssize_t index):
        """A new list of one column: 0 offsets, 1 timestamps, 2 keys, 3 values, 4 headers."""
        if index == 0:
            return self._ints(_SP_OFFSET, False)
        if index == 1:
            return self._ints(_SP_TS, True)
        if index == 2:
            return self._fields(_SP_KEY)
        if index == 3:
            return self._fields(_SP_VALUE)
        if index == 4:
            return list(self._headers)
        raise IndexError(f"column {index} of 0..4")

    def columns(self):
        """What :func:`read_columns` returns for the same batch and window."""
        return (self._ints(_SP_OFFSET, False), self._ints(_SP_TS, True), self._fields(_SP_KEY),
                self._fields(_SP_VALUE), list(self._headers))

    def int64_column(self, Py_ssize_t index):
        """Column 0 (offsets) or 1 (timestamps) as the bytes of one native int64 a record
        (an Arrow ``int64`` array's data buffer)."""
        return int64_columns((self,), index)

    def binary_column(self, Py_ssize_t index):
        """Column 2 (keys) or 3 (values) in Arrow's ``binary`` layout: ``(validity, offsets,
        data, null_count)``, the validity bitmap None when no record has None there, the
        offsets one native int32 a record and one more; the data each key or value after
        the other (one copy of each, no object a record).

        Raises:
            OverflowError: the data is 2 GiB or more (past int32 offsets).
        """
        return binary_columns((self,), index)

    cdef list _ints(self, Py_ssize_t col, bint share):
        """One int column; with ``share``, runs of equal values share one int object (a
        batch's records mostly share a timestamp)."""
        cdef Py_ssize_t i
        cdef int64_t v
        cdef int64_t last = 0
        cdef int64_t* t = self._table
        cdef object o = None
        cdef list out = PyList_New(self._n)
        for i in range(self._n):
            v = t[i * _SP_WIDTH + col]
            if not share or o is None or v != last:
                o = PyLong_FromLongLong(v)
                last = v
            Py_INCREF(o)
            PyList_SET_ITEM(out, i, o)
        return out

    cdef list _fields(self, Py_ssize_t col):
        """The keys (``_SP_KEY``) or the values (``_SP_VALUE``): bytes, or None."""
        cdef Py_ssize_t i
        cdef int64_t n
        cdef int64_t* t = self._table
        cdef const char* p = <const char*>self._view.buf
        cdef list out = PyList_New(self._n)
        for i in range(self._n):
            n = t[i * _SP_WIDTH + col + 1]
            if n < 0:
                f = None
            else:
                f = PyBytes_FromStringAndSize(p + t[i * _SP_WIDTH + col], <Py_ssize_t>n)
            Py_INCREF(f)
            PyList_SET_ITEM(out, i, f)
        return out


def int64_columns(spans, Py_ssize_t index):
    """See :func:`tidewire.records.reader.int64_columns` (the same contract)."""
    cdef Spans s
    cdef Py_ssize_t i, col, at
    cdef Py_ssize_t count = 0
    cdef int64_t* o
    if index != 0 and index != 1:
        raise IndexError(f"int64 column {index} of 0..1")
    parts = list(spans)
    for part in parts:
        if type(part) is not Spans:  # read by the pure reader (past 64 bits): its twin
            return _pure_reader.int64_columns(parts, index)
        count += (<Spans>part)._n
    col = _SP_OFFSET if index == 0 else _SP_TS
    out = PyBytes_FromStringAndSize(NULL, count * <Py_ssize_t>sizeof(int64_t))
    o = <int64_t*>PyBytes_AS_STRING(out)
    at = 0
    for part in parts:
        s = <Spans>part
        for i in range(s._n):
            o[at] = s._table[i * _SP_WIDTH + col]
            at += 1
    return out


def binary_columns(spans, Py_ssize_t index):
    """See :func:`tidewire.records.reader.binary_columns` (the same contract)."""
    cdef Spans s
    cdef Py_ssize_t i, col, at
    cdef Py_ssize_t count = 0
    cdef int64_t n
    cdef int64_t total = 0
    cdef Py_ssize_t nulls = 0
    cdef int64_t* t
    cdef const char* p
    cdef int32_t* offs
    cdef char* d
    cdef uint8_t* bits
    if index != 2 and index != 3:
        raise IndexError(f"binary column {index} of 2..3")
    col = _SP_KEY if index == 2 else _SP_VALUE
    parts = list(spans)
    for part in parts:
        if type(part) is not Spans:  # read by the pure reader (past 64 bits): its twin
            return _pure_reader.binary_columns(parts, index)
        s = <Spans>part
        t = s._table
        count += s._n
        for i in range(s._n):
            n = t[i * _SP_WIDTH + col + 1]
            if n < 0:
                nulls += 1
            else:
                total += n
    if total > 0x7FFFFFFF:
        raise OverflowError(f"{total:,} bytes of data: past Arrow binary's int32 offsets")
    offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * <Py_ssize_t>sizeof(int32_t))
    data = PyBytes_FromStringAndSize(NULL, <Py_ssize_t>total)
    validity = None
    bits = NULL
    if nulls:
        validity = PyBytes_FromStringAndSize(NULL, (count + 7) // 8)
        bits = <uint8_t*>PyBytes_AS_STRING(validity)
        memset(bits, 0, (count + 7) // 8)
    offs = <int32_t*>PyBytes_AS_STRING(offsets)
    d = PyBytes_AS_STRING(data)
    total = 0
    offs[0] = 0
    at = 0
    for part in parts:
        s = <Spans>part
        t = s._table
        p = <const char*>s._view.buf
        for i in range(s._n):
            n = t[i * _SP_WIDTH + col + 1]
            if n > 0:
                memcpy(d + total, p + t[i * _SP_WIDTH + col], <size_t>n)
                total += n
            if n >= 0 and bits != NULL:
                bits[at >> 3] |= <uint8_t>(1 << (at & 7))
            at += 1
            offs[at] = <int32_t>total
    return validity, offsets, data, nulls


cdef inline int _span(const uint8_t* p, Py_ssize_t* pos, Py_ssize_t rec_end,
                      int64_t* row) noexcept nogil:
    """Where a key or value is (row[0], row[1]: start and length, -1 for None), stepping
    past it; -1 on a fault (as _field)."""
    cdef int64_t n
    if _varint(p, pos, rec_end, False, &n) < 0 or n < -1 or n > rec_end - pos[0]:
        return -1
    row[0] = pos[0]
    row[1] = n
    if n > 0:
        pos[0] += <Py_ssize_t>n
    return 0


cdef int _scan_spans(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t base,
                     int64_t first_ts, int64_t last_delta, int64_t count, int64_t lo,
                     int64_t hi, int64_t* table, Py_ssize_t cap, list headers,
                     Py_ssize_t* made) except -1:
    """_scan's checks and window, writing each record's row of ``table`` (``cap`` rows at
    most) and headers; ``made[0]``: the rows written. Returns DONE, MALFORMED or TOO_WIDE."""
    cdef int64_t i, length, ts_delta, delta, offset, ts
    cdef int64_t prev = -1
    cdef Py_ssize_t rec_end
    cdef Py_ssize_t n = 0
    cdef int64_t* row
    cdef int64_t spare[_SP_WIDTH]
    cdef int bad = 0
    for i in range(count):
        if pos >= end:
            return MALFORMED
        if _varint(p, &pos, end, False, &length) < 0 or length < 6 or length > end - pos:
            return MALFORMED
        rec_end = pos + <Py_ssize_t>length
        pos += 1  # record attributes (unused)
        if _varint(p, &pos, rec_end, True, &ts_delta) < 0:
            return MALFORMED
        if _varint(p, &pos, rec_end, False, &delta) < 0 or delta <= prev or delta > last_delta:
            return MALFORMED
        prev = delta
        row = table + n * _SP_WIDTH if n < cap else spare
        if _span(p, &pos, rec_end, row + _SP_KEY) < 0:
            return MALFORMED
        if _span(p, &pos, rec_end, row + _SP_VALUE) < 0:
            return MALFORMED
        if pos < rec_end and p[pos] == 0:
            hdrs = _EMPTY
            pos += 1
        else:
            hdrs = _headers(p, &pos, rec_end, &bad)
            if bad:
                return MALFORMED
        if pos != rec_end:
            return MALFORMED
        if __builtin_add_overflow(base, delta, &offset) or __builtin_add_overflow(
            first_ts, ts_delta, &ts
        ):
            return TOO_WIDE
        if offset < lo:
            continue
        if offset > hi:
            break
        if n >= cap:  # cannot happen: cap >= count
            return MALFORMED
        row[_SP_OFFSET] = offset
        row[_SP_TS] = ts
        PyList_Append(headers, hdrs)
        n += 1
    else:
        if pos != end:
            return MALFORMED
    made[0] = n
    return DONE


def read_spans(buf, start, h, min_offset=0, decompression_limit=MAX_DECOMPRESSED_BYTES,
               max_offset=2**63 - 1):
    """See :func:`tidewire.records.reader.read_spans` (the same contract)."""
    cdef Spans s
    cdef Py_ssize_t pos, end, size, cap
    cdef Py_ssize_t made = 0
    cdef int64_t lo, hi, base, first_ts, last_delta, count
    cdef int status
    try:
        lo = min_offset
        hi = max_offset
        base = h.base_offset
        first_ts = h.first_timestamp
        last_delta = h.last_offset_delta
        count = h.records_count
    except OverflowError:
        return _pure_reader.read_spans(buf, start, h, min_offset, decompression_limit,
                                       max_offset)
    size = h.size
    if h.codec:
        section = memoryview(buf)[start : start + size][_OVERHEAD:]
        data = bytes(decompress(h.codec, section, decompression_limit))
        pos = 0
        end = PyBytes_GET_SIZE(data)
    else:
        data = buf
        pos = start + _OVERHEAD
        end = start + size
    s = Spans.__new__(Spans)
    s._headers = []
    PyObject_GetBuffer(data, &s._view, PyBUF_SIMPLE)
    s._held = True
    s._data = data
    if pos < 0 or end > s._view.len:
        status = MALFORMED
    else:
        # A record takes 7 bytes at least: a count past what fits is malformed (found by
        # the scan), and is not allocated for.
        cap = <Py_ssize_t>min(max(count, 0), (end - pos) // 7 + 1)
        s._table = <int64_t*>PyMem_Malloc(max(cap, 1) * _SP_WIDTH * sizeof(int64_t))
        if s._table == NULL:
            raise MemoryError()
        status = _scan_spans(<const uint8_t*>s._view.buf, pos, end, base, first_ts,
                             last_delta, count, lo, hi, s._table, cap, s._headers, &made)
    if status == DONE:
        s._n = made
        return s
    if status == TOO_WIDE:
        return _pure_reader.read_spans(buf, start, h, min_offset, decompression_limit,
                                       max_offset)
    # Malformed: the reference reader names the fault.
    for _ in _pure_reader.iter_records(
        memoryview(buf)[start : start + size], decompression_limit=decompression_limit
    ):
        pass
    raise InvalidRecordError("the batch's records are malformed")


# ---------------------------------------------------------------------------------------
# Building

cdef inline Py_ssize_t _put_varint(char* out, int64_t value) noexcept nogil:
    """Write the zigzag varint of ``value`` at ``out``; returns its size (10 at most)."""
    cdef uint64_t n = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    cdef Py_ssize_t i = 0
    while n >= 0x80:
        out[i] = <char>((n & 0x7F) | 0x80)
        n >>= 7
        i += 1
    out[i] = <char>n
    return i + 1


cdef inline Py_ssize_t _varint_size(int64_t value) noexcept nogil:
    cdef uint64_t n = (<uint64_t>value << 1) ^ <uint64_t>(value >> 63)
    cdef Py_ssize_t i = 1
    while n >= 0x80:
        n >>= 7
        i += 1
    return i


def append_record(bytearray buf not None, value, key, bytes headers not None,
                  timestamp_delta, Py_ssize_t offset_delta):
    """See :func:`tidewire.records.builder.append_record` (the same bytes and result), for
    a bytearray ``buf``: the record is written straight into it (grown by at least an eighth
    at a time, so appends are amortised). A value or key that is bytes-like but not bytes
    (bytearray, memoryview) is copied as its bytes first, as the pure twin's join takes it."""
    cdef int64_t tsd
    cdef Py_ssize_t klen, vlen, hlen, body, total, at
    cdef char* out
    try:
        tsd = timestamp_delta
    except OverflowError:  # past 64 bits: the pure twin raises its error
        return _pure_append_record(buf, value, key, headers, timestamp_delta, offset_delta)
    if value is not None and type(value) is not bytes:
        value = bytes(memoryview(value))
    if key is not None and type(key) is not bytes:
        key = bytes(memoryview(key))
    klen = -1 if key is None else PyBytes_GET_SIZE(key)
    vlen = -1 if value is None else PyBytes_GET_SIZE(value)
    hlen = PyBytes_GET_SIZE(headers)
    body = (1 + _varint_size(tsd) + _varint_size(offset_delta) + _varint_size(klen)
            + _varint_size(vlen) + hlen)
    if klen > 0:
        body += klen
    if vlen > 0:
        body += vlen
    total = body + _varint_size(body)
    at = PyByteArray_GET_SIZE(buf)
    PyByteArray_Resize(buf, at + total)
    out = PyByteArray_AS_STRING(buf) + at
    out += _put_varint(out, body)
    out[0] = 0  # attributes
    out += 1
    out += _put_varint(out, tsd)
    out += _put_varint(out, offset_delta)
    out += _put_varint(out, klen)
    if klen > 0:
        memcpy(out, PyBytes_AS_STRING(key), klen)
        out += klen
    out += _put_varint(out, vlen)
    if vlen > 0:
        memcpy(out, PyBytes_AS_STRING(value), vlen)
        out += vlen
    if hlen:
        memcpy(out, PyBytes_AS_STRING(headers), hlen)
    return total


cdef class BatchBuilder:
    """See :class:`tidewire.records.builder.BatchBuilder` (the same API and bytes).

    The records are encoded into one growing buffer as they are appended; :meth:`build`
    compresses it once, writes the header and the CRC-32C.
    """

    cdef object _codec, _producer_id, _producer_epoch, _sequence, _leader_epoch
    cdef object _timestamp_type, _base_offset, _first_ts, _max_ts, _built
    cdef char* _buf
    cdef Py_ssize_t _len, _cap, _count
    cdef bint _closed

    def __cinit__(self):
        self._buf = NULL
        self._len = 0
        self._cap = 0
        self._count = 0
        self._closed = False

    def __init__(self, *, codec=Codec.NONE, producer_id=-1, producer_epoch=-1,
                 base_sequence=-1, partition_leader_epoch=-1,
                 timestamp_type=TimestampType.CREATE_TIME, base_offset=0):
        self._codec = check_codec(codec)
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._sequence = base_sequence
        self._leader_epoch = partition_leader_epoch
        self._timestamp_type = timestamp_type
        self._base_offset = base_offset
        self._first_ts = None
        self._max_ts = -1
        self._built = None

    def __dealloc__(self):
        PyMem_Free(self._buf)

    def __len__(self):
        """Number of records appended so far."""
        return self._count

    @property
    def size_in_bytes(self):
        """Size of the batch so far, before compression (exact for ``Codec.NONE``)."""
        return _OVERHEAD + self._len

    cdef int _reserve(self, Py_ssize_t more) except -1:
        cdef Py_ssize_t cap = self._cap
        cdef char* grown
        if self._len + more <= cap:
            return 0
        cap = max(cap * 2, self._len + more, 4096)
        grown = <char*>PyMem_Realloc(self._buf, cap)
        if grown == NULL:
            raise MemoryError()
        self._buf = grown
        self._cap = cap
        return 0

    def append(self, value, *, timestamp_ms, key=None, headers=()):
        """Append one record; returns its offset delta within the batch.

        Raises:
            RuntimeError: the batch was already built.
        """
        cdef Py_buffer kview, vview
        cdef bint has_key = False, has_value = False
        cdef Py_ssize_t body, klen = -1, vlen = -1, hlen = 0, at
        cdef int64_t ts, first, tsd = 0
        cdef bint wide_delta = False
        cdef char* out
        if self._closed:
            raise RuntimeError("append() after build(): start a new BatchBuilder")
        first_obj = self._first_ts
        if first_obj is None:
            first_obj = self._first_ts = self._max_ts = timestamp_ms
        elif timestamp_ms > self._max_ts:
            self._max_ts = timestamp_ms
        cdef Py_ssize_t delta = self._count
        # The timestamp delta in C when both ends fit in 64 bits; otherwise as varint.encode
        # does it (which refuses a delta past 64 bits with its ValueError).
        tsd_bytes = None
        try:
            ts = timestamp_ms
            first = first_obj
            if __builtin_sub_overflow(ts, first, &tsd):
                wide_delta = True
        except (OverflowError, TypeError):
            wide_delta = True
        if wide_delta:
            tsd_bytes = _pure_varint.encode(timestamp_ms - first_obj)
        if headers:
            hbytes = _pure_encode_headers(headers)
            hlen = PyBytes_GET_SIZE(hbytes)
        else:
            hbytes = None
            hlen = 1
        if key is not None:
            PyObject_GetBuffer(key, &kview, PyBUF_SIMPLE)
            has_key = True
        try:
            if value is not None:
                PyObject_GetBuffer(value, &vview, PyBUF_SIMPLE)
                has_value = True
            klen = kview.len if has_key else -1
            vlen = vview.len if has_value else -1
            body = (
                1
                + (PyBytes_GET_SIZE(tsd_bytes) if wide_delta else _varint_size(tsd))
                + _varint_size(delta)
                + _varint_size(klen) + (klen if klen > 0 else 0)
                + _varint_size(vlen) + (vlen if vlen > 0 else 0)
                + hlen
            )
            self._reserve(body + 10)
            out = self._buf + self._len
            at = _put_varint(out, body)
            out[at] = 0  # record attributes: unused, always 0
            at += 1
            if wide_delta:
                memcpy(out + at, PyBytes_AS_STRING(tsd_bytes), PyBytes_GET_SIZE(tsd_bytes))
                at += PyBytes_GET_SIZE(tsd_bytes)
            else:
                at += _put_varint(out + at, tsd)
            at += _put_varint(out + at, delta)
            at += _put_varint(out + at, klen)
            if klen > 0:
                memcpy(out + at, kview.buf, klen)
                at += klen
            at += _put_varint(out + at, vlen)
            if vlen > 0:
                memcpy(out + at, vview.buf, vlen)
                at += vlen
            if hbytes is None:
                out[at] = 0
                at += 1
            else:
                memcpy(out + at, PyBytes_AS_STRING(hbytes), hlen)
                at += hlen
        finally:
            if has_key:
                PyBuffer_Release(&kview)
            if has_value:
                PyBuffer_Release(&vview)
        self._len += at
        self._count += 1
        return delta

    def build(self):
        """Close the batch and return its bytes (header, compressed records, CRC)."""
        self._closed = True
        if self._built is not None:
            return self._built
        cdef Py_ssize_t count = self._count
        # A view of the records where they were encoded: seal_batch copies them once, into
        # the batch's bytes (the uncompressed case), and computes the CRC over them.
        section = PyMemoryView_FromMemory(self._buf, self._len, PyBUF_READ)
        if self._codec is not Codec.NONE:
            section = compress(self._codec, bytes(section))
        out = seal_batch(
            section,
            codec=self._codec,
            count=count,
            first_timestamp=self._first_ts if self._first_ts is not None else -1,
            max_timestamp=self._max_ts if count else -1,
            producer_id=self._producer_id,
            producer_epoch=self._producer_epoch,
            base_sequence=self._sequence,
            timestamp_type=self._timestamp_type,
            base_offset=self._base_offset,
            partition_leader_epoch=self._leader_epoch,
        )
        section = None  # the view, before the memory under it is freed
        self._built = out
        PyMem_Free(self._buf)
        self._buf = NULL
        self._cap = 0
        return out
