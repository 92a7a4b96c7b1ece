// Reading the graph's answer: softmax over logits and the k most probable classes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vitdeploy {

struct Scored {
    int index;
    float prob;
};

// Numerically stable softmax (max subtracted first), computed in double.
std::vector<float> softmax(const float* logits, std::size_t n);

// The k most probable classes, highest first; ties go to the lower index (as vitdeploy's Python
// runtime orders them: a stable sort on -prob).
std::vector<Scored> top_k(const std::vector<float>& probs, std::size_t k);

// "label 0.9312, label 0.0412, ..." for printing.
std::string format_top(const std::vector<Scored>& top, const std::vector<std::string>& labels);

}  // namespace vitdeploy
