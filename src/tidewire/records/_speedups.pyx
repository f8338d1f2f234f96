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


# The producer's one-call append, its batches' C fields, the buffer pool and the key hash
# (records._impl exposes them; the compiled module's __all__ stays the readers' and builder's).
from cpython.list cimport PyList_GET_SIZE
from libc.stdint cimport uint32_t


cdef extern from *:
    """
    /* Room for ``extra`` more bytes at the end of the bytearray ``buf``: a pointer to it, or
       NULL with the exception set. Within the allocation the size is only moved on: growing
       through PyByteArray_Resize would first shrink a recycled buffer (it reallocates down
       to the exact size when the new size is under half the allocation), whose pages the
       next batch then faults in again. With a buffer exported, or past the allocation,
       PyByteArray_Resize does it (and raises what it raises). */
    static char* tw_grow(PyObject* buf, Py_ssize_t extra) {
        Py_ssize_t at = Py_SIZE(buf);
    #if PY_VERSION_HEX < 0x030E0000 && !defined(PYPY_VERSION)
        PyByteArrayObject* b = (PyByteArrayObject*)buf;
        if (b->ob_exports == 0 && b->ob_start == b->ob_bytes && at + extra < b->ob_alloc) {
            Py_SET_SIZE(buf, at + extra);
            b->ob_start[at + extra] = 0;  /* the trailing NUL bytearrays keep */
            return b->ob_start + at;
        }
    #endif
        if (PyByteArray_Resize(buf, at + extra) < 0) return NULL;
        return PyByteArray_AS_STRING(buf) + at;
    }

    /* Whether the bytearray ``buf``, held by ``refs`` references, none of them an export,
       may be emptied to ``size`` zero bytes and reused, its allocation kept. */
    static int tw_reset(PyObject* buf, Py_ssize_t refs, Py_ssize_t size) {
    #if PY_VERSION_HEX < 0x030E0000 && !defined(PYPY_VERSION)
        PyByteArrayObject* b = (PyByteArrayObject*)buf;
        if (Py_REFCNT(buf) != refs || b->ob_exports != 0 || b->ob_start != b->ob_bytes
                || size >= b->ob_alloc) {
            return 0;
        }
        Py_SET_SIZE(buf, size);
        memset(b->ob_start, 0, size + 1);
        return 1;
    #else
        return 0;
    #endif
    }

    /* A tuple subclass instance (the producer's RecordFuture) of 3 items, each reference
       stolen: what tuple.__new__(cls, (a, b, c)) makes, without the argument tuple. */
    static PyObject* tw_triple(PyObject* cls, PyObject* a, PyObject* b, PyObject* c) {
        PyTypeObject* t = (PyTypeObject*)cls;
        PyObject* made = t->tp_alloc(t, 3);
        if (made == NULL) {
            Py_DECREF(a); Py_DECREF(b); Py_DECREF(c);
            return NULL;
        }
        PyTuple_SET_ITEM(made, 0, a); PyTuple_SET_ITEM(made, 1, b);
        PyTuple_SET_ITEM(made, 2, c);
        return made;
    }
    """
    object tw_triple(object cls, PyObject* a, PyObject* b, PyObject* c)
    char* tw_grow(object buf, Py_ssize_t extra) except NULL
    int tw_reset(object buf, Py_ssize_t refs, Py_ssize_t size)


def append_record(bytearray buf not None, value, key, bytes headers not None,
                  timestamp_delta, Py_ssize_t offset_delta):
    """See :func:`tidewire.records.builder.append_record` (the same bytes and result), for
    a bytearray ``buf``: the record is written straight into it (grown by at least an eighth
    at a time, so appends are amortised). A value or key that is bytes-like but not bytes
    (bytearray, memoryview) is copied as its bytes first, as the pure twin's join takes it."""
    cdef int64_t tsd
    cdef Py_ssize_t klen, vlen, hlen, body, total
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
    out = tw_grow(buf, total)
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


cdef class OpenRecords:
    """See :class:`tidewire.records.builder.OpenRecords`: the same attributes, held in C
    fields that :func:`append_routed` reads and writes directly."""

    cdef public object buf
    cdef public Py_ssize_t size
    cdef public Py_ssize_t count
    cdef public object first_ts
    cdef public object max_ts


cdef int64_t _NS_PER_MS = 1_000_000
#: Room the accumulator keeps for a record's deltas and length prefix besides its payload.
cdef Py_ssize_t _RECORD_SLACK = 16


cdef inline uint32_t _fnv1a_32(const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t h = 0x811C9DC5
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ p[i]) * <uint32_t>0x01000193
    return h


def append_routed(dict topics not None, topic, key, value, timestamp_ns, acc, future_cls):
    """The producer's hot path for a message without headers, partition or timestamp, in one
    call: what ``AsyncProducer._append`` and ``Accumulator.append`` do for it when the batch
    it goes to is open and has room, then the message's future, ``future_cls((batch, index,
    timestamp))``. That batch: for an unkeyed message (``key`` None), ``topic``'s sticky
    batch (``_Topic.sticky_batch``); for a keyed one, the open batch of partition
    ``fnv1a_32(key) % partitions``.

    ``topics`` is the producer's ``_Topic`` of each topic name, ``acc`` its ``Accumulator``
    (their attributes are read and updated exactly as the Python path does, under ``acc``'s
    append lock when it has one); ``timestamp_ns`` is ``time.time_ns()`` (the record's
    timestamp is its whole ms).

    Returns None, having changed nothing, whenever the Python path has anything else to do:
    a topic not known yet, no open batch there (none yet, or closed), a key or value that is
    not ``bytes``, a batch or buffer without room (the Python path rolls over, opens, waits
    or raises), a writer's records to skip, a timestamp outside 64 bits. The record's bytes
    are :func:`append_record`'s."""
    cdef Py_ssize_t vlen, klen, n, need, size, index, body, total, used, room
    cdef int64_t tns, ts, first, max_ts, tsd
    cdef char* out
    cdef OpenRecords batch
    if value is not None and type(value) is not bytes:
        return None
    meta = topics.get(topic)
    if meta is None:
        return None
    if key is None:
        klen = -1
        found = meta.sticky_batch
        if not isinstance(found, OpenRecords):
            return None  # none yet (or the pure twin's batch)
        batch = <OpenRecords>found
        state = batch.state
    else:
        if type(key) is not bytes:
            return None
        klen = PyBytes_GET_SIZE(key)
        parts = meta.partitions
        n = len(parts)
        if n == 0:
            return None
        state = parts[_fnv1a_32(<const unsigned char*>PyBytes_AS_STRING(key), klen) % n]
        if state.skipped < state.skip:
            return None  # a writer's record the broker holds already
        found = state.open
        if not isinstance(found, OpenRecords):
            return None  # no open batch: the Python path opens one
        batch = <OpenRecords>found
    vlen = -1 if value is None else PyBytes_GET_SIZE(value)
    # Accumulator.append's estimate: attributes, value length and value (or a null value),
    # the one-byte empty headers part, the key's length and key (or a null key); then the
    # deltas and prefix.
    n = 3 if vlen < 0 else 1 + _varint_size(vlen) + vlen + 1
    n += 1 if klen < 0 else _varint_size(klen) + klen
    need = n + _RECORD_SLACK
    limit = meta.limit
    room = acc.buffer_bytes
    if need + _OVERHEAD > limit or need > room:
        return None  # too large: the Python path raises
    tns = timestamp_ns
    if tns < 0:
        return None
    ts = tns // _NS_PER_MS
    lock = acc._append_lock
    if lock is not None:
        lock.acquire()
    try:
        if state.open is not batch:
            return None  # sent or closed: the Python path moves on
        buf = batch.buf
        if type(buf) is not bytearray:
            return None
        try:
            first = batch.first_ts
            max_ts = batch.max_ts
        except OverflowError:  # a timestamp past 64 bits: the Python path raises its error
            return None
        if __builtin_sub_overflow(ts, first, &tsd):
            return None
        used = acc.used
        if used + need > room:
            return None
        size = batch.size
        index = batch.count
        if index and (size + need > acc.batch_bytes or size + need > limit):
            return None  # full: the Python path closes it and opens the next
        body = (1 + _varint_size(tsd) + _varint_size(index) + _varint_size(klen)
                + (klen if klen > 0 else 0) + _varint_size(vlen) + (vlen if vlen > 0 else 0)
                + 1)
        total = body + _varint_size(body)
        out = tw_grow(buf, total)
        out += _put_varint(out, body)
        out[0] = 0  # attributes
        out += 1
        out += _put_varint(out, tsd)
        out += _put_varint(out, index)
        out += _put_varint(out, klen)
        if klen > 0:
            memcpy(out, PyBytes_AS_STRING(key), klen)
            out += klen
        out += _put_varint(out, vlen)
        if vlen > 0:
            memcpy(out, PyBytes_AS_STRING(value), vlen)
            out += vlen
        out[0] = 0  # no headers
        batch.size = size + total
        acc.used = used + total
        batch.count = index + 1
        if ts == max_ts:
            stamp = batch.max_ts  # the same ms as the last record's: its int, not a new one
        else:
            stamp = PyLong_FromLongLong(ts)
            if ts > max_ts:
                batch.max_ts = stamp
    finally:
        if lock is not None:
            lock.release()
    i = PyLong_FromLongLong(index)
    Py_INCREF(batch)
    Py_INCREF(i)
    Py_INCREF(stamp)
    return tw_triple(future_cls, <PyObject*>batch, <PyObject*>i, <PyObject*>stamp)


def recycle_buffer(list pool not None, batch, Py_ssize_t keep):
    """Keep a finished batch's buffer for the next batch: its pages are touched already, so
    the next batch's records are written without page faults (a fresh 1 MiB buffer costs
    256 of them, about 0.15 CPU-us a message of 1 KB).

    ``batch.data`` (the sealed batch, a bytearray, built in place from ``batch.buf``) is
    emptied to ``BATCH_OVERHEAD`` zero bytes, its allocation kept, appended to ``pool`` and
    replaced by ``b""`` (the batch still counts as sent) -- only when nothing else holds it:
    no other reference (a transport still writing it, a caller) and no export (memoryview);
    and while ``pool`` holds fewer than ``keep``. Returns whether it was kept."""
    if PyList_GET_SIZE(pool) >= keep:
        return False
    data = batch.data
    if type(data) is not bytearray:
        return False  # compressed (new bytes), or not built
    # Its references: batch.data and ``data`` here.
    if not tw_reset(data, 2, _OVERHEAD):
        return False
    batch.data = b""
    PyList_Append(pool, data)
    return True


def fnv1a_32(data):
    """See :func:`tidewire.client.partitioner.fnv1a_32` (the same hash; the key of a keyed
    message chooses its partition by it): a loop in C over ``bytes``; anything else goes
    through the same Python-level loop as the pure twin (same results, same errors)."""
    if type(data) is not bytes:
        g = 0x811C9DC5
        for byte in data:
            g = ((g ^ byte) * 0x01000193) & 0xFFFFFFFF
        return g
    return _fnv1a_32(<const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


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
