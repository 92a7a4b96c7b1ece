#include "vitdeploy/image.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include <libexif/exif-data.h>
// The implementation comes from Debian's libstb (libstb-dev); this is the declaration only.
#include <stb_image.h>

#include "vitdeploy/resample.hpp"

namespace vitdeploy {

Image decode_image(const std::string& path) {
    int w = 0, h = 0, channels_in_file = 0;
    // Ask for 3 channels: stb replicates gray and drops alpha, like convert("RGB").
    std::unique_ptr<stbi_uc, void (*)(void*)> data(stbi_load(path.c_str(), &w, &h, &channels_in_file, 3), stbi_image_free);
    if (!data) {
        const char* why = stbi_failure_reason();
        throw std::runtime_error("cannot read image " + path + ": " + (why ? why : "unknown error") +
                                 "; give a JPEG, PNG, BMP, TGA or PNM file");
    }
    Image img;
    img.height = h;
    img.width = w;
    img.pixels.assign(data.get(), data.get() + static_cast<size_t>(w) * h * 3);
    return apply_orientation(img, read_exif_orientation(path));
}

int read_exif_orientation(const std::string& path) {
    ExifData* ed = exif_data_new_from_file(path.c_str());
    if (!ed) return 1;
    int orientation = 1;
    if (ExifEntry* entry = exif_data_get_entry(ed, EXIF_TAG_ORIENTATION)) {
        if (entry->format == EXIF_FORMAT_SHORT && entry->components >= 1)
            orientation = exif_get_short(entry->data, exif_data_get_byte_order(ed));
    }
    exif_data_unref(ed);
    return (orientation >= 1 && orientation <= 8) ? orientation : 1;
}

Image apply_orientation(const Image& img, int orientation) {
    if (orientation <= 1 || orientation > 8) return img;
    const int H = img.height, W = img.width;
    const bool swap = orientation >= 5;  // 5..8 exchange height and width
    Image out;
    out.height = swap ? W : H;
    out.width = swap ? H : W;
    out.pixels.resize(img.pixels.size());
    for (int y = 0; y < out.height; ++y) {
        for (int x = 0; x < out.width; ++x) {
            int sy = y, sx = x;
            switch (orientation) {
                case 2: sx = W - 1 - x; break;                  // mirror left-right
                case 3: sy = H - 1 - y; sx = W - 1 - x; break;  // rotate 180
                case 4: sy = H - 1 - y; break;                  // mirror top-bottom
                case 5: sy = x; sx = y; break;                  // transpose
                case 6: sy = H - 1 - x; sx = y; break;          // rotate 90 clockwise
                case 7: sy = H - 1 - x; sx = W - 1 - y; break;  // transverse
                case 8: sy = x; sx = W - 1 - y; break;          // rotate 90 counter-clockwise
            }
            std::copy_n(img.at(sy, sx), 3, out.at(y, x));
        }
    }
    return out;
}

ResizeGeometry resize_geometry(int h, int w, const HostResize& rule, int th, int tw) {
    // Same arithmetic as vitdeploy.images.resize_geometry; Python's round() is half-to-even, and
    // so is std::nearbyint in the default rounding mode.
    const double crop = rule.crop_pct > 0.0 ? rule.crop_pct : 1.0;
    const int sh = static_cast<int>(std::floor(th / crop));
    const int sw = static_cast<int>(std::floor(tw / crop));
    int nh, nw;
    if (rule.mode == "stretch") {
        nh = sh;
        nw = sw;
    } else if (rule.mode == "shorter-side-center-crop") {
        if (sh == sw) {  // torchvision Resize(int): short edge = s, long edge truncated
            if (w <= h) {
                nw = sh;
                nh = static_cast<int>(static_cast<double>(sh) * h / w);
            } else {
                nh = sh;
                nw = static_cast<int>(static_cast<double>(sh) * w / h);
            }
        } else {  // timm ResizeKeepRatio: cover the target, keep the aspect ratio
            const double ratio = std::min(static_cast<double>(h) / sh, static_cast<double>(w) / sw);
            nh = static_cast<int>(std::nearbyint(h / ratio));
            nw = static_cast<int>(std::nearbyint(w / ratio));
        }
    } else {
        throw std::runtime_error("unknown host_resize mode '" + rule.mode + "'");
    }
    return {nh, nw, static_cast<int>(std::nearbyint((nh - th) / 2.0)), static_cast<int>(std::nearbyint((nw - tw) / 2.0))};
}

Image resize_for_model(const Image& img, const HostResize& rule, int th, int tw) {
    const ResizeGeometry g = resize_geometry(img.height, img.width, rule, th, tw);
    const Image resized = resample(img, g.resized_h, g.resized_w, rule.interpolation);
    if (g.top < 0 || g.left < 0 || g.top + th > resized.height || g.left + tw > resized.width)
        throw std::runtime_error("resize rule gives a crop outside the image (crop_pct > 1?)");
    Image out{th, tw, std::vector<std::uint8_t>(static_cast<size_t>(th) * tw * 3)};
    for (int y = 0; y < th; ++y) std::copy_n(resized.at(g.top + y, g.left), static_cast<size_t>(tw) * 3, out.at(y, 0));
    return out;
}

void to_bgr(Image& img) {
    for (size_t i = 0; i + 2 < img.pixels.size(); i += 3) std::swap(img.pixels[i], img.pixels[i + 2]);
}

Image load_for_model(const std::string& path, const Bundle& bundle, int th, int tw) {
    if (bundle.preprocessing.input != "uint8-nhwc")
        throw std::runtime_error("this example feeds uint8-nhwc graphs; the bundle takes " + bundle.preprocessing.input);
    Image img = resize_for_model(decode_image(path), bundle.preprocessing.host_resize, th, tw);
    if (bundle.preprocessing.channel_order == "bgr") to_bgr(img);
    return img;
}

}  // namespace vitdeploy
