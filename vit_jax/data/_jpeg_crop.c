/* Cropped JPEG decoding through libjpeg(-turbo)'s partial-decode API: the pixels of one box of a JPEG, optionally
 * at a DCT-domain scale of 1/2, 1/4 or 1/8, without the work outside it.
 *
 * Why: a random-resized crop keeps on average ~half of a photo (and at 128 px output, often much less). A full
 * decode entropy-decodes every row and runs the inverse DCT, upsampling and colour conversion on every pixel. Here
 * jpeg_crop_scanline limits the inverse DCT / upsampling / colour work to the iMCU columns that hold the box,
 * jpeg_skip_scanlines skips that work for the rows above it, and decoding stops after the box's last row, so the
 * rows below it are not even entropy-decoded. It is what TensorFlow's decode_and_crop_jpeg does.
 *
 * Exactness: the pixels equal those of a full decode (same library, same settings: ISLOW IDCT, fancy upsampling),
 * cropped. Fancy upsampling blends each chroma sample with its neighbours, and a cropped region's first and last
 * columns have none, so the region asked of libjpeg reaches one pixel past the box on each side where the image
 * continues; tests/data/test_jpeg_crop.py compares every pixel against full decodes.
 *
 * Anything unusual is left to the caller's full-decode path, which reports errors in its own words: the function
 * returns 0 (no pixels written) for an error libjpeg raises, for any warning (corrupt data that libjpeg would patch
 * over, e.g. a premature end), and for colour spaces it cannot turn into RGB (CMYK, YCCK).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

struct error_manager {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
};

static void on_error(j_common_ptr cinfo) { longjmp(((struct error_manager *)cinfo->err)->jump, 1); }

static void on_output(j_common_ptr cinfo) { (void)cinfo; } /* warnings are counted, never printed */

/* 1 when box (x, y, w, h) of the 1/scale image was written to out (h rows of w RGB pixels), 0 otherwise. */
static int decode_box(const unsigned char *data, size_t size, int scale, int x, int y, int w, int h,
                      unsigned char *out) {
  struct jpeg_decompress_struct cinfo;
  struct error_manager err;
  unsigned char *volatile row = NULL;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.output_message = on_output;
  if (setjmp(err.jump)) {
    free(row);
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, (unsigned long)size);
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_GRAYSCALE &&
      cinfo.jpeg_color_space != JCS_RGB) {
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = (unsigned int)scale;
  jpeg_start_decompress(&cinfo);
  const int full_w = (int)cinfo.output_width, full_h = (int)cinfo.output_height;
  if (cinfo.output_components != 3 || x < 0 || y < 0 || w <= 0 || h <= 0 || x + w > full_w || y + h > full_h) {
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  /* One pixel of context on each side (see the top); libjpeg widens the region to whole iMCU columns. */
  JDIMENSION left = (JDIMENSION)(x > 0 ? x - 1 : 0);
  JDIMENSION width = (JDIMENSION)((x + w < full_w ? x + w + 1 : full_w)) - left;
  if (left > 0 || width < (JDIMENSION)full_w) jpeg_crop_scanline(&cinfo, &left, &width);
  row = malloc((size_t)width * 3);
  if (row == NULL) {
    jpeg_destroy_decompress(&cinfo);
    return 0;
  }
  if (y > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)y) != (JDIMENSION)y) longjmp(err.jump, 1);
  const size_t skip = (size_t)(x - (int)left) * 3, line = (size_t)w * 3;
  for (int i = 0; i < h; i++) {
    JSAMPROW rows[1] = {row};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) longjmp(err.jump, 1);
    memcpy(out + (size_t)i * line, row + skip, line);
  }
  const int clean = err.pub.num_warnings == 0;
  free(row);
  jpeg_destroy_decompress(&cinfo); /* abandons the rest of the data: nothing below the box is decoded */
  return clean;
}

static PyObject *decode(PyObject *self, PyObject *args) {
  (void)self;
  Py_buffer data, out;
  int scale, x, y, w, h;
  if (!PyArg_ParseTuple(args, "y*w*iiiii", &data, &out, &scale, &x, &y, &w, &h)) return NULL;
  int ok = 0;
  if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
    PyErr_Format(PyExc_ValueError, "scale must be 1, 2, 4 or 8, got %d", scale);
  } else if (w > 0 && h > 0 && out.len < (Py_ssize_t)w * h * 3) {
    PyErr_Format(PyExc_ValueError, "out holds %zd bytes, a %dx%d RGB box needs %lld", out.len, w, h,
                 (long long)w * h * 3);
  } else {
    Py_BEGIN_ALLOW_THREADS ok = decode_box((const unsigned char *)data.buf, (size_t)data.len, scale, x, y, w, h,
                                           (unsigned char *)out.buf);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&data);
  PyBuffer_Release(&out);
  if (PyErr_Occurred()) return NULL;
  return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(data, out, scale, x, y, w, h) -> bool\n\n"
     "Writes box (x, y, w, h) of the JPEG `data` decoded at 1/scale size into the writable buffer `out` (h rows of\n"
     "w RGB pixels). False (nothing useful written) for errors, warnings, a box outside the image and colour\n"
     "spaces other than YCbCr, RGB and grayscale. Releases the GIL while decoding."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg_crop", "Cropped JPEG decoding (libjpeg-turbo).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__jpeg_crop(void) { return PyModule_Create(&module); }
